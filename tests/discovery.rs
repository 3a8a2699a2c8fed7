//! Discovery and failed reconciles on the in-process test API server (issue "Real clusters, real
//! charts"): a kind no server serves is refused at once, as `helm install` refuses it, and the
//! release goes on by itself within seconds of its CRD being installed; an error that fails
//! reconciles is told in the conditions and a Warning event from the second failure in a row,
//! and a release the controller has seen never has an empty STATUS.

use sequenced_testkit as support;

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, Patch, PatchParams};
use sequenced::api::ReleasePhase;
use serde_json::json;
use support::charts::{chart, condition, config_map, is_ready, is_stalled, message, release};
use support::operator::Operator;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(150), test)
        .await
        .expect("the scenario did not finish in time");
}

/// A namespaced CRD of kind Widget in example.com/v1, any fields allowed.
fn widget_crd() -> serde_json::Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    })
}

const WIDGET: &str = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: gadget\n  annotations:\n    helm.sh/layer: app\n    helm.sh/depends-on/layers: config\nspec:\n  size: 3\n";

/// Chart `shop` of one layer: ConfigMap `settings`.
fn settings_chart() -> tempfile::TempDir {
    chart(
        "shop",
        &[(
            "templates/config.yaml",
            &config_map("settings", "helm.sh/layer: config"),
        )],
    )
}

/// The Warning events about release `name` with `reason`: their notes and counts.
async fn warnings(op: &Operator, name: &str, reason: &str) -> Vec<(String, i32)> {
    let events: Api<Event> = Api::namespaced(op.client.clone(), "default");
    events
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
                && e.type_.as_deref() == Some("Warning")
        })
        .map(|e| {
            let count = e.series.as_ref().map_or(1, |s| s.count);
            (e.note.unwrap_or_default(), count)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_no_server_serves_is_refused_at_once_and_goes_on_once_its_crd_is_installed() {
    within(async {
        let op = Operator::start(4).await;
        let dir = chart(
            "gadgets",
            &[
                ("templates/config.yaml", &config_map("settings", "helm.sh/layer: config")),
                ("templates/widget.yaml", WIDGET),
            ],
        );
        op.create(
            "default",
            release("gadgets", &dir.path().join("gadgets"), json!({"interval": "10m"})),
        )
        .await;
        let sr = op.wait_release("default", "gadgets", "Stalled", is_stalled).await;
        let (_, reason, text) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "UnknownKind");
        assert_eq!(
            text,
            "no matches for kind \"Widget\" in version \"example.com/v1\" (Widget/gadget of chart gadgets, templates/widget.yaml): no API server serves this kind, nor does a CRD of the chart; ensure CRDs are installed first (helm install refuses the chart the same way). The release goes on by itself once it is served"
        );
        assert_eq!(sr.status.as_ref().unwrap().phase, Some(ReleasePhase::Failed));
        // Refused before anything was applied: not half-deployed.
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "settings").is_none());
        let note = op.wait_event("default", "gadgets", "Stalled").await;
        assert_eq!(note, text);

        // The CRD is installed by someone else: the release goes on by itself, long before its
        // interval (10 minutes).
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            Api::all(op.client.clone());
        let installed = Instant::now();
        crds.create(&Default::default(), &serde_json::from_value(widget_crd()).unwrap())
            .await
            .expect("create the CRD");
        op.wait_release("default", "gadgets", "Ready", is_ready).await;
        let took = installed.elapsed();
        assert!(took < Duration::from_secs(30), "went on only after {took:?}");
        assert!(op.server.object("example.com/v1", "Widget", Some("default"), "gadget").is_some());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_a_crd_of_the_chart_defines_is_not_refused() {
    within(async {
        let op = Operator::start(4).await;
        let crd = serde_yaml_ng::to_string(&widget_crd()).unwrap();
        let dir = chart(
            "gadgets",
            &[
                ("crds/widgets.yaml", crd.as_str()),
                (
                    "templates/config.yaml",
                    &config_map("settings", "helm.sh/layer: config"),
                ),
                ("templates/widget.yaml", WIDGET),
            ],
        );
        op.create(
            "default",
            release("gadgets", &dir.path().join("gadgets"), json!({})),
        )
        .await;
        op.wait_release("default", "gadgets", "Ready", is_ready)
            .await;
        assert!(
            op.server
                .object("example.com/v1", "Widget", Some("default"), "gadget")
                .is_some()
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_reconcile_is_told_from_its_second_failure_and_set_back_once_it_passes() {
    within(async {
        let op = Operator::start(4).await;
        let dir = settings_chart();
        // Every apply of the ConfigMap fails for a while (an API server in trouble).
        op.server.fail_next("PATCH", "/configmaps/settings", 500, 4);
        op.create(
            "default",
            release("shop", &dir.path().join("shop"), json!({})),
        )
        .await;
        let sr = op
            .wait_release("default", "shop", "the failure told", |sr| {
                condition(sr, "Ready").is_some_and(|c| c.1 == "ReconcileFailed")
            })
            .await;
        let (ready, _, text) = condition(&sr, "Ready").unwrap();
        assert_eq!(ready, "False");
        assert!(
            text.starts_with(
                "reconcile failed, tried again with backoff: applying ConfigMap default/settings:"
            ),
            "{text}"
        );
        let (reconciling, reason, _) = condition(&sr, "Reconciling").unwrap();
        assert_eq!(
            (reconciling.as_str(), reason.as_str()),
            ("True", "ReconcileFailed")
        );
        // The phase and message still say where the release is.
        assert_eq!(
            sr.status.as_ref().unwrap().phase,
            Some(ReleasePhase::Deploying)
        );
        assert!(message(&sr).contains("settings"), "{}", message(&sr));
        let note = op.wait_event("default", "shop", "ReconcileFailed").await;
        assert!(
            note.starts_with("applying ConfigMap default/settings:"),
            "{note}"
        );

        // The server recovers: Ready, and nothing of the failure is left in the conditions.
        let sr = op.wait_release("default", "shop", "Ready", is_ready).await;
        for type_ in ["Ready", "Reconciling", "Stalled"] {
            let (_, reason, _) = condition(&sr, type_).unwrap();
            assert_ne!(reason, "ReconcileFailed", "{type_}");
        }
        // One event, counted: the failures after the first, each told.
        let told = warnings(&op, "shop", "ReconcileFailed").await;
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(told[0].1, 3, "{told:?}");
        // Backed off: after the failures that changed the status (and so woke the release at
        // once), the retries waited 4 s and 8 s (with jitter), not a burst.
        let applies: Vec<std::time::Instant> = op
            .server
            .requests()
            .iter()
            .filter(|r| r.verb == "apply" && r.path.ends_with("/configmaps/settings"))
            .map(|r| r.at)
            .collect();
        assert_eq!(applies.len(), 5);
        let spread = applies[4].duration_since(applies[0]);
        assert!(spread >= Duration::from_secs(8), "{spread:?}");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_first_reconcile_fails_has_a_status_at_once() {
    within(async {
        let op = Operator::start(4).await;
        let dir = settings_chart();
        // Adding the finalizer, the first thing a reconcile writes, fails.
        op.server
            .fail_next("PATCH", "/sequencedreleases/shop", 500, 1);
        op.create(
            "default",
            release("shop", &dir.path().join("shop"), json!({})),
        )
        .await;
        let sr = op
            .wait_release("default", "shop", "a Ready condition", |sr| {
                condition(sr, "Ready").is_some()
            })
            .await;
        let (ready, reason, text) = condition(&sr, "Ready").unwrap();
        assert_eq!(
            (ready.as_str(), reason.as_str()),
            ("False", "ReconcileFailed")
        );
        assert!(
            text.contains("updating the finalizers of default/shop"),
            "{text}"
        );
        op.wait_release("default", "shop", "Ready", is_ready).await;
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_release_that_fails_to_reconcile_stays_ready_and_says_so() {
    within(async {
        let op = Operator::start(4).await;
        let dir = settings_chart();
        op.create(
            "default",
            release("shop", &dir.path().join("shop"), json!({"interval": "1s"})),
        )
        .await;
        op.wait_release("default", "shop", "Ready", is_ready).await;
        // Its drift checks fail for a while: still Ready, Reconciling with the failure. (A Ready
        // release compares its objects after a watch event shows one changed: a label added by
        // hand is such an event.)
        op.server.fail_next("GET", "/configmaps/settings", 500, 4);
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(op.client.clone(), "default")
            .patch(
                "settings",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"touched": "by-hand"}}})),
            )
            .await
            .unwrap();
        let sr = op
            .wait_release("default", "shop", "the failure told", |sr| {
                condition(sr, "Reconciling").is_some_and(|c| c.1 == "ReconcileFailed")
            })
            .await;
        let (ready, _, _) = condition(&sr, "Ready").unwrap();
        assert_eq!(ready, "True");
        assert_eq!(sr.status.as_ref().unwrap().phase, Some(ReleasePhase::Ready));
        // Then it passes, and the conditions are as before.
        let sr = op
            .wait_release("default", "shop", "the failure gone", |sr| {
                condition(sr, "Reconciling").is_some_and(|c| c.0 == "False")
            })
            .await;
        assert!(is_ready(&sr));
        let patch = json!({"spec": {"interval": "10m"}});
        op.releases("default")
            .patch("shop", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        op.stop().await;
    })
    .await;
}

/// Registers the APIService of `widgets.example.io/v1alpha1`, backed by Service
/// `widgets-api` in namespace `widgets`, which does not exist: the API is down (its
/// group-version answers 503, as recorded in aggregated-api-unavailable.json).
async fn register_down_api(op: &Operator) {
    let apiservice = json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1alpha1.widgets.example.io"},
        "spec": {"group": "widgets.example.io", "version": "v1alpha1", "groupPriorityMinimum": 100,
                 "versionPriority": 100, "insecureSkipTLSVerify": true,
                 "service": {"name": "widgets-api", "namespace": "widgets", "port": 443}}
    });
    let api: Api<kube::api::DynamicObject> = Api::all_with(
        op.client.clone(),
        &support::api_resource("apiregistration.k8s.io/v1", "APIService", "apiservices"),
    );
    api.create(
        &Default::default(),
        &serde_json::from_value(apiservice).unwrap(),
    )
    .await
    .expect("create the APIService");
}

/// The API comes up: its backend serves Gizmos, and its Service exists.
async fn bring_up_api(op: &Operator) {
    op.server.serve_aggregated(
        "widgets.example.io",
        "v1alpha1",
        &[("gizmos", "Gizmo", true)],
    );
    op.namespace("widgets").await;
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(op.client.clone(), "widgets");
    let service = json!({"metadata": {"name": "widgets-api"},
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443}]}});
    services
        .create(
            &Default::default(),
            &serde_json::from_value(service).unwrap(),
        )
        .await
        .expect("create the Service");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_aggregated_api_holds_up_no_release_that_does_not_use_it() {
    within(async {
        // Down before the controller starts: its first discovery meets the 503.
        let op = Operator::without_controller().await;
        register_down_api(&op).await;
        let controller = op.spawn("sequenced-1", 4);
        let dir = chart(
            "shop",
            &[
                (
                    "templates/config.yaml",
                    &config_map("{{ .Release.Name }}-settings", "helm.sh/layer: config"),
                ),
                (
                    "templates/app.yaml",
                    &config_map(
                        "{{ .Release.Name }}-app",
                        "helm.sh/layer: app\n    helm.sh/depends-on/layers: config",
                    ),
                ),
            ],
        );
        for name in ["one", "two", "three"] {
            op.create(
                "default",
                release(name, &dir.path().join("shop"), json!({"releaseName": name})),
            )
            .await;
        }
        for name in ["one", "two", "three"] {
            op.wait_release("default", name, "Ready", is_ready).await;
        }
        // The down group-version was asked once by discovery, not retried in the client (a
        // blanket retry of 503s held every release for minutes).
        let asked = op
            .server
            .requests()
            .iter()
            .filter(|r| r.path == "/apis/widgets.example.io/v1alpha1")
            .map(|r| r.status)
            .collect::<Vec<_>>();
        assert!(!asked.is_empty() && asked.len() <= 2, "{asked:?}");
        assert!(asked.iter().all(|s| *s == 503), "{asked:?}");
        controller.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_needs_a_down_group_waits_naming_its_apiservice_and_goes_on_when_it_is_up() {
    within(async {
        let op = Operator::start(4).await;
        register_down_api(&op).await;
        // A layer that waits for a Gizmo (a werf external dependency): the release needs the
        // down group to resolve it.
        let waiting = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: uses-gizmo\n  annotations:\n    gizmo.external-dependency.werf.io/resource: gizmo.widgets.example.io/main\ndata:\n  a: b\n";
        let dir = chart("gadgets", &[("templates/uses.yaml", waiting)]);
        op.create("default", release("gadgets", &dir.path().join("gadgets"), json!({})))
            .await;
        let sr = op
            .wait_release("default", "gadgets", "waiting for the group", |sr| {
                condition(sr, "Ready").is_some_and(|c| c.1 == "GroupUnavailable")
            })
            .await;
        let (_, _, text) = condition(&sr, "Ready").unwrap();
        assert_eq!(
            text,
            "waiting: API group widgets.example.io/v1alpha1 is unavailable: APIService v1alpha1.widgets.example.io is not Available (ServiceNotFound: service/widgets-api in \"widgets\" is not present); GET /apis/widgets.example.io/v1alpha1: 503 service unavailable; asked again with backoff"
        );
        let (_, _, stalled) = condition(&sr, "Stalled").unwrap_or_default();
        assert!(stalled.is_empty(), "waiting is not stalled: {stalled}");
        let note = op.wait_event("default", "gadgets", "ReconcileFailed").await;
        assert!(note.starts_with("API group widgets.example.io/v1alpha1 is unavailable"), "{note}");

        // Up: the release goes on at once and now waits for the Gizmo itself.
        bring_up_api(&op).await;
        let sr = op
            .wait_release("default", "gadgets", "waiting for the Gizmo", |sr| {
                message(sr).contains("waiting for external dependency gizmo.widgets.example.io")
            })
            .await;
        let (_, reason, _) = condition(&sr, "Ready").unwrap();
        assert_eq!(reason, "Progressing");
        op.stop().await;
    })
    .await;
}
