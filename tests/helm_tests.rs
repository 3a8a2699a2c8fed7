//! Helm tests run by the operator (`spec.test`, `sequenced test`), as Flux runs them, on the
//! in-process test API server: the chart's `helm.sh/hook: test` hooks run one at a time in
//! Helm's order after an install or upgrade is ready, with Helm's delete policies; the release
//! is Ready only once they pass; `status.tests`, the `TestSuccess` condition and the events say
//! how each went, a failed one with its pod's last log lines. A failed test is a failed
//! operation for `retries` and `onFailure` (rollback, uninstall, keep) unless `ignoreFailures`;
//! `filters` choose the tests; a run on request is never remediated. The testkit plays the Job
//! controller and the kubelet, running the tests' `sh -c` scripts (their `echo` lines are the
//! log, their `exit` decides).

use sequenced_testkit as support;

use std::future::Future;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use sequenced::api::TEST_REQUEST_ANNOTATION;
use sequenced::api::v1alpha1::{
    LayerPhase, ReleasePhase, RemediationAction, SequencedRelease, SequencedReleaseStatus,
    TestPhase,
};
use serde_json::json;
use support::charts::{chart, condition, config_map, is_ready, is_stalled, message, release};
use support::operator::{Operator, is_write};
use tempfile::TempDir;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(150), test)
        .await
        .expect("the scenario did not finish in time");
}

/// A test Job `name` at `weight` whose container prints `GET /healthz` and then, when the
/// values say `broken`, `FAIL: /healthz answered 503` and exits 1; deleted once every test
/// passed (`hook-succeeded`).
fn smoke_job(name: &str, weight: i32) -> String {
    format!(
        r#"apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  annotations:
    helm.sh/hook: test
    helm.sh/hook-weight: "{weight}"
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: smoke
          image: busybox:1.36
          command: ["sh", "-c", "echo GET /healthz; {{{{ if .Values.broken }}}}echo 'FAIL: /healthz answered 503'; exit 1{{{{ else }}}}echo ok{{{{ end }}}}"]
"#
    )
}

/// A test Pod `name` (Helm 2's `test-success` event) that prints `connected`, with the default
/// delete policy (`before-hook-creation`: it stays after the run).
fn connection_pod(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations:
    helm.sh/hook: test-success
spec:
  restartPolicy: Never
  containers:
    - name: wget
      image: busybox:1.36
      command: ["sh", "-c", "echo connected"]
"#
    )
}

/// Chart `shop`: ConfigMap `settings` (layer `config`), a test Pod `connection` and a test Job
/// `smoke` at weight 0 (Helm runs them by weight, then name: connection, smoke), and a test Job
/// `a-last` at weight 5 (after both, though its name comes first).
fn shop() -> TempDir {
    chart(
        "shop",
        &[
            (
                "templates/settings.yaml",
                &config_map("settings", "helm.sh/layer: config"),
            ),
            (
                "templates/tests/connection.yaml",
                &connection_pod("connection"),
            ),
            ("templates/tests/smoke.yaml", &smoke_job("smoke", 0)),
            ("templates/tests/last.yaml", &smoke_job("a-last", 5)),
        ],
    )
}

fn status(sr: &SequencedRelease) -> &SequencedReleaseStatus {
    sr.status.as_ref().expect("a status")
}

/// `(name, phase)` of each test of `status.tests`.
fn tests(sr: &SequencedRelease) -> Vec<(String, TestPhase)> {
    status(sr)
        .tests
        .iter()
        .map(|t| (t.name.clone(), t.phase))
        .collect()
}

fn revision_is(n: i64) -> impl Fn(&SequencedRelease) -> bool {
    move |sr| sr.status.as_ref().and_then(|s| s.revision) == Some(n)
}

/// The successful writes to test hooks (`create` for an apply, `delete`), in order.
fn test_writes(op: &Operator, from: usize) -> Vec<String> {
    op.server
        .requests()
        .iter()
        .skip(from)
        .filter(|r| is_write(r) && r.status < 300 && r.subresource.is_none())
        .filter(|r| matches!(r.name.as_deref(), Some("connection" | "smoke" | "a-last")))
        .filter(|r| r.kind.as_deref() != Some("Lease"))
        .map(|r| {
            let verb = if r.verb == "apply" { "create" } else { r.verb };
            format!(
                "{verb} {}/{}",
                r.kind.as_deref().unwrap_or_default(),
                r.name.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

fn exists(op: &Operator, api_version: &str, kind: &str, name: &str) -> bool {
    op.server
        .object(api_version, kind, Some("default"), name)
        .is_some()
}

/// Runs the real helm against the test API server, in namespace default.
async fn helm(op: &Operator, args: &[&str]) -> String {
    let url = op.server.url();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let dir = TempDir::new().unwrap();
        let kubeconfig = support::kubeconfig(&dir, &url, "default");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        support::run_helm(&kubeconfig, &args)
    })
    .await
    .expect("helm")
}

/// Asks for a test run as `sequenced test` does: a fresh token on the annotation.
async fn request_tests(op: &Operator, name: &str, token: &str) {
    let patch = json!({"metadata": {"annotations": {TEST_REQUEST_ANNOTATION: token}}});
    op.releases("default")
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("request the tests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passing_tests_run_one_at_a_time_in_helms_order_after_the_install_and_the_release_is_ready()
{
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op
            .server
            .job_controller_running_scripts(Duration::from_millis(50));
        let dir = shop();
        op.create(
            "default",
            release(
                "shop",
                &dir.path().join("shop"),
                json!({"test": {"enable": true}}),
            ),
        )
        .await;
        let sr = op.wait_release("default", "shop", "Ready", is_ready).await;
        let st = status(&sr);
        let stages: Vec<(&str, LayerPhase)> = st
            .layers
            .iter()
            .map(|l| (l.name.as_str(), l.phase))
            .collect();
        assert_eq!(
            stages,
            [("config", LayerPhase::Ready), ("(test)", LayerPhase::Ready)]
        );
        assert_eq!(st.layers[1].resources, 3);
        assert_eq!(
            tests(&sr),
            [
                ("connection".to_string(), TestPhase::Succeeded),
                ("smoke".to_string(), TestPhase::Succeeded),
                ("a-last".to_string(), TestPhase::Succeeded),
            ]
        );
        assert_eq!(st.tests[0].kind, "Pod");
        assert_eq!(st.tests[1].kind, "Job");
        assert!(st.tests.iter().all(|t| t.started_at.is_some()
            && t.finished_at.is_some()
            && t.duration.is_some()
            && t.message.is_none()));
        assert_eq!(
            condition(&sr, "TestSuccess").unwrap(),
            (
                "True".into(),
                "TestSucceeded".into(),
                "revision 1: 3 tests succeeded".into()
            )
        );
        assert!(
            message(&sr).ends_with("; 3 tests succeeded"),
            "{}",
            message(&sr)
        );
        // One at a time, each created once the one before succeeded; the Jobs with
        // hook-succeeded are deleted once every test passed, the last first; the Pod stays.
        assert_eq!(
            test_writes(&op, 0),
            [
                "create Pod/connection",
                "create Job/smoke",
                "create Job/a-last",
                "delete Job/a-last",
                "delete Job/smoke",
            ]
        );
        // The first test starts only after the layer is ready, the next one after it is done.
        let requests = op.server.requests();
        let at = |verb: &str, name: &str| {
            requests
                .iter()
                .position(|r| r.verb == verb && r.name.as_deref() == Some(name) && r.status < 300)
                .unwrap_or_else(|| panic!("{verb} {name}"))
        };
        assert!(at("apply", "settings") < at("apply", "connection"));
        assert!(exists(&op, "v1", "Pod", "connection"));
        let note = op.wait_event("default", "shop", "TestSucceeded").await;
        assert_eq!(note, "revision 1: 3 tests succeeded");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_test_fails_the_install_with_its_pods_log_and_keep_with_retries_tries_it_again() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op.server.job_controller_running_scripts(Duration::from_millis(50));
        let dir = shop();
        op.create(
            "default",
            release(
                "shop",
                &dir.path().join("shop"),
                json!({"test": {"enable": true}, "values": {"broken": true}, "retries": 1}),
            ),
        )
        .await;
        // Revision 1 fails on its test, the retry (revision 2) too; then Stalled (keep).
        let sr = op
            .wait_release("default", "shop", "Stalled at revision 2", |sr| {
                is_stalled(sr) && revision_is(2)(sr)
            })
            .await;
        let st = status(&sr);
        assert_eq!(st.phase, Some(ReleasePhase::Failed));
        assert_eq!(st.failures, Some(2));
        let (ready, reason, text) = condition(&sr, "Ready").unwrap();
        assert_eq!((ready.as_str(), reason.as_str()), ("False", "TestFailed"));
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("test hook Job/smoke (chart shop, templates/tests/smoke.yaml) failed: Job smoke: failed (BackoffLimitExceeded: Job has reached the specified backoff limit)")
        );
        let head = lines.next().unwrap_or_default();
        assert!(head.starts_with("last 2 log lines of pod smoke-"), "{text}");
        assert!(head.ends_with(" (container smoke):"), "{text}");
        assert_eq!(
            lines.collect::<Vec<_>>(),
            ["GET /healthz", "FAIL: /healthz answered 503"]
        );
        // The test that failed is the last that ran: Helm stops at the first failure.
        assert_eq!(
            tests(&sr),
            [
                ("connection".to_string(), TestPhase::Succeeded),
                ("smoke".to_string(), TestPhase::Failed),
            ]
        );
        let failed = &st.tests[1];
        assert_eq!(failed.message.as_deref(), Some(text.as_str()));
        let (success, reason, _) = condition(&sr, "TestSuccess").unwrap();
        assert_eq!((success.as_str(), reason.as_str()), ("False", "TestFailed"));
        let layer = st.layers.iter().find(|l| l.name == "(test)").unwrap();
        assert_eq!(layer.phase, LayerPhase::Failed);
        // The failed Job stays (no hook-failed policy), for kubectl logs.
        assert!(exists(&op, "batch/v1", "Job", "smoke"));
        assert!(!exists(&op, "batch/v1", "Job", "a-last"));
        let note = op.wait_event("default", "shop", "TestFailed").await;
        assert!(note.ends_with("FAIL: /healthz answered 503"), "{note}");
        // Nothing is rolled back or uninstalled: the objects stay.
        assert!(exists(&op, "v1", "ConfigMap", "settings"));
        assert!(st.remediation.is_none());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_test_after_an_upgrade_with_on_failure_rollback_rolls_back() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op
            .server
            .job_controller_running_scripts(Duration::from_millis(50));
        let dir = shop();
        op.create(
            "default",
            release(
                "shop",
                &dir.path().join("shop"),
                json!({"test": {"enable": true}, "onFailure": "rollback"}),
            ),
        )
        .await;
        op.wait_release("default", "shop", "revision 1 Ready", is_ready)
            .await;
        op.patch_spec("shop", json!({"values": {"broken": true}}))
            .await;
        let sr = op
            .wait_release("default", "shop", "rolled back (revision 3)", |sr| {
                sr.status.as_ref().and_then(|s| s.phase) == Some(ReleasePhase::Ready)
                    && revision_is(3)(sr)
            })
            .await;
        let st = status(&sr);
        let (ready, reason, _) = condition(&sr, "Ready").unwrap();
        assert_eq!((ready.as_str(), reason.as_str()), ("False", "RolledBack"));
        let (stalled, _, _) = condition(&sr, "Stalled").unwrap();
        assert_eq!(stalled, "True", "held back until the spec changes");
        let remediation = st.remediation.as_ref().expect("status.remediation");
        assert_eq!(remediation.failed_revision, 2);
        assert_eq!(remediation.action, RemediationAction::Rollback);
        let failure = remediation.failure.as_deref().unwrap_or_default();
        assert!(
            failure
                .starts_with("test hook Job/smoke (chart shop, templates/tests/smoke.yaml) failed"),
            "{failure}"
        );
        assert!(
            failure.ends_with("FAIL: /healthz answered 503"),
            "{failure}"
        );
        assert!(
            message(&sr).starts_with(
                "rolled back to revision 1 after revision 2 failed: test hook Job/smoke"
            ),
            "{}",
            message(&sr)
        );
        let phases: Vec<(i64, ReleasePhase)> =
            st.history.iter().map(|h| (h.revision, h.phase)).collect();
        assert_eq!(
            phases,
            [
                (3, ReleasePhase::Ready),
                (2, ReleasePhase::Failed),
                (1, ReleasePhase::Ready)
            ]
        );
        // A rollback is not tested (as Flux): no (test) stage, no results of revision 2 left.
        assert!(
            st.layers.iter().all(|l| l.name != "(test)"),
            "{:?}",
            st.layers
        );
        assert!(st.tests.is_empty());
        assert!(condition(&sr, "TestSuccess").is_none());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_test_with_retries_then_on_failure_uninstall_removes_the_release_objects() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op
            .server
            .job_controller_running_scripts(Duration::from_millis(50));
        let dir = shop();
        op.create(
            "default",
            release(
                "shop",
                &dir.path().join("shop"),
                json!({
                    "test": {"enable": true},
                    "values": {"broken": true},
                    "retries": 1,
                    "onFailure": "uninstall",
                }),
            ),
        )
        .await;
        let sr = op
            .wait_release("default", "shop", "uninstalled after revision 2", |sr| {
                is_stalled(sr) && condition(sr, "Stalled").is_some_and(|c| c.1 == "Uninstalled")
            })
            .await;
        let st = status(&sr);
        assert_eq!(st.revision, Some(2), "one retry, then the remediation");
        let remediation = st.remediation.as_ref().expect("status.remediation");
        assert_eq!(remediation.action, RemediationAction::Uninstall);
        assert!(
            remediation
                .failure
                .as_deref()
                .unwrap_or_default()
                .starts_with("test hook Job/smoke"),
            "{remediation:?}"
        );
        assert!(!exists(&op, "v1", "ConfigMap", "settings"));
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_failures_keeps_the_release_ready_and_tells_the_failed_test() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op.server.job_controller_running_scripts(Duration::from_millis(50));
        let dir = shop();
        op.create(
            "default",
            release(
                "shop",
                &dir.path().join("shop"),
                json!({
                    "test": {"enable": true, "ignoreFailures": true},
                    "values": {"broken": true},
                    "onFailure": "rollback",
                }),
            ),
        )
        .await;
        let sr = op.wait_release("default", "shop", "Ready", is_ready).await;
        let st = status(&sr);
        assert_eq!(st.phase, Some(ReleasePhase::Ready));
        assert_eq!(st.revision, Some(1));
        assert_eq!(st.failures, None);
        assert_eq!(
            message(&sr),
            "revision 1 (chart version 0.1.0) is ready: 1 layers, 1 resources; test Job/smoke failed (spec.test.ignoreFailures)"
        );
        let (success, reason, text) = condition(&sr, "TestSuccess").unwrap();
        assert_eq!((success.as_str(), reason.as_str()), ("False", "TestFailed"));
        assert!(text.ends_with("FAIL: /healthz answered 503"), "{text}");
        assert_eq!(
            tests(&sr),
            [
                ("connection".to_string(), TestPhase::Succeeded),
                ("smoke".to_string(), TestPhase::Failed),
            ]
        );
        op.wait_event("default", "shop", "TestFailed").await;
        // Ready stays: no retry, no remediation.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let sr = op.releases("default").get("shop").await.unwrap();
        assert_eq!(status(&sr).revision, Some(1));
        assert!(status(&sr).remediation.is_none());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_select_and_exclude_tests_by_name() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op
            .server
            .job_controller_running_scripts(Duration::from_millis(50));
        let dir = shop();
        // Excluded: a-last; of those left, only the selected run (the broken smoke test is not
        // selected, so the release is Ready).
        op.create(
            "default",
            release(
                "shop",
                &dir.path().join("shop"),
                json!({
                    "values": {"broken": true},
                    "test": {"enable": true, "filters": [
                        {"name": "a-last", "exclude": true},
                        {"name": "connection"},
                    ]},
                }),
            ),
        )
        .await;
        let sr = op.wait_release("default", "shop", "Ready", is_ready).await;
        assert_eq!(
            tests(&sr),
            [("connection".to_string(), TestPhase::Succeeded)]
        );
        let layer = status(&sr)
            .layers
            .iter()
            .find(|l| l.name == "(test)")
            .unwrap();
        assert_eq!(layer.resources, 1);
        assert_eq!(test_writes(&op, 0), ["create Pod/connection"]);
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tests_run_on_request_without_a_new_revision_and_a_failure_is_not_remediated() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op
            .server
            .job_controller_running_scripts(Duration::from_millis(50));
        let dir = shop();
        // Tests not enabled: the install does not run them; the chart's smoke test is broken.
        op.create(
            "default",
            release(
                "shop",
                &dir.path().join("shop"),
                json!({"values": {"broken": true}, "onFailure": "rollback"}),
            ),
        )
        .await;
        let sr = op.wait_release("default", "shop", "Ready", is_ready).await;
        assert!(status(&sr).layers.iter().all(|l| l.name != "(test)"));
        assert!(test_writes(&op, 0).is_empty(), "no test runs on install");
        let records = op.writes("Secret").len();

        request_tests(&op, "shop", "first").await;
        let sr = op
            .wait_release("default", "shop", "the run on request over", |sr| {
                let st = status(sr);
                st.last_handled_test_at.as_deref() == Some("first")
                    && st.phase == Some(ReleasePhase::Ready)
            })
            .await;
        let st = status(&sr);
        assert_eq!(st.revision, Some(1), "no new revision");
        assert_eq!(st.test_refused, None);
        let (ready, _, _) = condition(&sr, "Ready").unwrap();
        assert_eq!(ready, "True", "a run on request is never remediated");
        let (success, reason, _) = condition(&sr, "TestSuccess").unwrap();
        assert_eq!((success.as_str(), reason.as_str()), ("False", "TestFailed"));
        assert_eq!(
            tests(&sr),
            [
                ("connection".to_string(), TestPhase::Succeeded),
                ("smoke".to_string(), TestPhase::Failed),
            ]
        );
        assert!(
            st.tests[1]
                .message
                .as_deref()
                .unwrap_or_default()
                .ends_with("FAIL: /healthz answered 503")
        );
        assert_eq!(
            st.layers.last().map(|l| (l.name.as_str(), l.phase)),
            Some(("(test)", LayerPhase::Failed))
        );
        assert!(st.remediation.is_none() && st.rollback.is_none());
        // No new revision: revision 1's record keeps the run, and its status, as helm reads it.
        let written: Vec<(String, String)> =
            op.writes("Secret").into_iter().skip(records).collect();
        assert!(
            written
                .iter()
                .all(|(_, name)| name == "default/sh.helm.release.v1.shop.v1"),
            "{written:?}"
        );
        let printed = helm(&op, &["status", "shop"]).await;
        assert!(printed.contains("\nREVISION: 1\n"), "{printed}");
        assert!(printed.contains("\nSTATUS: deployed\n"), "{printed}");
        let suites: Vec<&str> = printed
            .lines()
            .filter(|l| l.starts_with("TEST SUITE") || l.starts_with("Phase:"))
            .collect();
        assert_eq!(
            suites,
            [
                "TEST SUITE:     connection",
                "Phase:          Succeeded",
                "TEST SUITE:     smoke",
                "Phase:          Failed",
            ],
            "{printed}"
        );

        // A drift correction re-creates a deleted object and is Ready again, without running
        // the tests again or failing on the ones that failed on request.
        let from = op.server.requests().len();
        let config_maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(op.server.client(), "default");
        config_maps
            .delete("settings", &kube::api::DeleteParams::default())
            .await
            .expect("delete the ConfigMap");
        let sr = op
            .wait_release("default", "shop", "Ready after the correction", |sr| {
                is_ready(sr)
                    && sr
                        .status
                        .as_ref()
                        .is_some_and(|s| s.last_drift_correction.is_some())
            })
            .await;
        assert_eq!(status(&sr).revision, Some(1));
        assert!(
            test_writes(&op, from).is_empty(),
            "{:?}",
            test_writes(&op, from)
        );
        // A second run creates the tests again (the Pod left by the first is replaced:
        // before-hook-creation).
        let from = op.server.requests().len();
        request_tests(&op, "shop", "second").await;
        let sr = op
            .wait_release("default", "shop", "the second run over", |sr| {
                let st = status(sr);
                st.last_handled_test_at.as_deref() == Some("second")
                    && st.phase == Some(ReleasePhase::Ready)
            })
            .await;
        assert_eq!(status(&sr).revision, Some(1));
        assert_eq!(
            test_writes(&op, from),
            [
                "delete Pod/connection",
                "create Pod/connection",
                "delete Job/smoke",
                "create Job/smoke",
            ]
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tests_asked_for_on_a_failed_release_are_refused() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op.server.job_controller_running_scripts(Duration::from_millis(50));
        let failing = r#"apiVersion: batch/v1
kind: Job
metadata:
  name: check
  annotations:
    helm.sh/layer: check
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: check
          image: busybox:1.36
          command: ["sh", "-c", "echo no; exit 1"]
"#;
        let dir = chart(
            "broken",
            &[
                ("templates/check.yaml", failing),
                ("templates/tests/connection.yaml", &connection_pod("connection")),
            ],
        );
        op.create("default", release("broken", &dir.path().join("broken"), json!({}))).await;
        op.wait_release("default", "broken", "Stalled", is_stalled).await;
        request_tests(&op, "broken", "t1").await;
        let sr = op
            .wait_release("default", "broken", "the request handled", |sr| {
                status(sr).last_handled_test_at.as_deref() == Some("t1")
            })
            .await;
        let refused = status(&sr).test_refused.clone().unwrap_or_default();
        assert!(
            refused.starts_with("tests not run: the release is Failed at revision 1, not Ready: layer check of chart broken failed"),
            "{refused}"
        );
        assert_eq!(status(&sr).phase, Some(ReleasePhase::Failed));
        let note = op.wait_event("default", "broken", "TestRefused").await;
        assert_eq!(note, refused);
        assert!(!exists(&op, "v1", "Pod", "connection"));
        op.stop().await;
    })
    .await;
}
