//! `sequenced reconcile`, `sequenced rollback` and `sequenced test` as a user runs them: the built binary and a
//! kubeconfig that points at the in-process test API server. In most tests the test plays the
//! operator: it reads the request's token from the annotation and writes the status through the
//! status subresource, as the operator does. The last two run the real controller, to keep the
//! commands and the operator agreeing on the annotations and the status.

use sequenced_testkit as support;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams, PostParams};
use sequenced::api::v1alpha1::SequencedRelease;
use sequenced::api::{
    FORCE_REQUEST_ANNOTATION, RECONCILE_REQUEST_ANNOTATION, ROLLBACK_REQUEST_ANNOTATION,
    ROLLBACK_REVISION_ANNOTATION,
};
use serde_json::{Value, json};
use support::apiserver::TestApiServer;
use support::charts::{chart, config_map, is_ready, release};
use support::operator::Operator;
use tempfile::TempDir;
use tokio::process::{Child, Command};

const KIND: &str = "SequencedRelease";

/// The test client that plays the operator; the command's requests carry no client name.
const OPERATOR: &str = "operator";

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(120), test)
        .await
        .expect("the test did not finish in time");
}

/// Starts `sequenced ARGS` with this kubeconfig, stdout and stderr captured, and nothing of the
/// environment that could point it at another cluster.
fn spawn(kubeconfig: &Path, args: &[&str]) -> Child {
    Command::from(support::sequenced_command(
        env!("CARGO_BIN_EXE_sequenced"),
        kubeconfig,
    ))
    .args(args)
    .kill_on_drop(true)
    .spawn()
    .expect("run sequenced")
}

async fn finish(child: Child) -> Output {
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("sequenced did not exit in time")
        .expect("wait for sequenced")
}

async fn sequenced(kubeconfig: &Path, args: &[&str]) -> Output {
    finish(spawn(kubeconfig, args)).await
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts exit code 2, nothing on stdout and one line on stderr; returns that line.
fn one_line_error(output: &Output) -> String {
    let stderr = stderr(output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(output.stdout.is_empty(), "printed: {}", stdout(output));
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr.trim_end().to_string()
}

/// Asserts exit code 0 and one line `PREFIX (token TOKEN)` on stdout; returns the token.
fn requested(output: &Output, prefix: &str) -> String {
    assert!(output.status.success(), "{}", stderr(output));
    let line = stdout(output);
    let token = line
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix(" (token "))
        .and_then(|rest| rest.strip_suffix(")\n"))
        .unwrap_or_else(|| panic!("not `{prefix} (token ...)`: {line}"));
    assert_rfc3339_nanos(token);
    token.to_string()
}

/// A token is the time of the request, RFC 3339 with nanoseconds: 2026-11-24T10:11:12.123456789Z.
fn assert_rfc3339_nanos(token: &str) {
    assert!(
        token.parse::<k8s_openapi::jiff::Timestamp>().is_ok()
            && token.len() == "2026-11-24T10:11:12.123456789Z".len()
            && token.as_bytes()[19] == b'.'
            && token.ends_with('Z'),
        "{token}"
    );
}

/// The test API server with the CRD, the namespace `apps`, and a kubeconfig whose context
/// namespace is `apps`, where the commands look when not given `-n`.
struct Cluster {
    op: Operator,
    kubeconfig: PathBuf,
    _home: TempDir,
}

impl Cluster {
    async fn start() -> Cluster {
        let op = Operator::without_controller().await;
        op.namespace("apps").await;
        let home = TempDir::new().expect("temp dir");
        let kubeconfig = support::kubeconfig(&home, &op.server.url(), "apps");
        Cluster {
            op,
            kubeconfig,
            _home: home,
        }
    }

    fn server(&self) -> &TestApiServer {
        &self.op.server
    }

    /// The releases of `apps`, read and written as the operator does.
    fn releases(&self) -> Api<SequencedRelease> {
        Api::namespaced(self.server().client_as(OPERATOR), "apps")
    }

    /// Creates release `apps/name` with `annotations` and writes `status` to it.
    async fn release(&self, name: &str, annotations: Value, status: Value) {
        let mut object = release(name, Path::new("/charts/shop"), json!({}));
        object["metadata"]["annotations"] = annotations;
        let object: SequencedRelease = serde_json::from_value(object).expect("release JSON");
        self.releases()
            .create(&PostParams::default(), &object)
            .await
            .expect("create the release");
        self.write_status(name, status).await;
    }

    /// Writes `status` through the status subresource, as the operator does.
    async fn write_status(&self, name: &str, status: Value) {
        self.releases()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
            .expect("write the status");
    }

    async fn annotations(&self, name: &str) -> BTreeMap<String, String> {
        let release = self.releases().get(name).await.expect("the release");
        release.metadata.annotations.unwrap_or_default()
    }

    /// Waits, as the operator's watch would, until release `name` has `annotation`; its value.
    async fn requested(&self, name: &str, annotation: &str) -> String {
        loop {
            if let Some(value) = self.annotations(name).await.get(annotation) {
                return value.clone();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the command has read release `name` twice more, so it has seen what the test
    /// wrote last, and asserts that it went on waiting.
    async fn still_waiting_after_two_reads(&self, name: &str, child: &mut Child) {
        let before = command_reads(self.server(), name);
        while command_reads(self.server(), name) < before + 2 {
            if let Some(exit) = child.try_wait().expect("poll") {
                panic!("the command ended ({exit}) before the operation had");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            child.try_wait().expect("poll").is_none(),
            "the command ended before the operation had"
        );
    }

    /// The requests the command made (not the test) that write a SequencedRelease.
    fn command_writes(&self) -> Vec<support::apiserver::RecordedRequest> {
        self.server()
            .requests()
            .into_iter()
            .filter(|r| {
                r.client.is_none()
                    && r.kind.as_deref() == Some(KIND)
                    && !matches!(r.verb, "get" | "list" | "watch")
            })
            .collect()
    }
}

/// How many times the command (a client without a test name) has read release `name`.
fn command_reads(server: &TestApiServer, name: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| {
            r.verb == "get"
                && r.client.is_none()
                && r.kind.as_deref() == Some(KIND)
                && r.name.as_deref() == Some(name)
        })
        .count()
}

fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_wait_sets_the_annotations_and_removes_what_an_earlier_request_left() {
    within(async {
        let cluster = Cluster::start().await;
        let earlier = "2026-01-01T00:00:00.000000000Z";
        cluster
            .release(
                "shop",
                json!({
                    "team": "payments",
                    FORCE_REQUEST_ANNOTATION: earlier,
                    ROLLBACK_REVISION_ANNOTATION: "2",
                }),
                json!({"phase": "Ready", "revision": 4, "message": "revision 4 is ready"}),
            )
            .await;
        let k = &cluster.kubeconfig;

        // Without --force an earlier forceAt goes: it would make this request a forced one.
        let out = sequenced(k, &["reconcile", "shop", "--no-wait"]).await;
        let first = requested(&out, "requested a reconcile of apps/shop");
        assert_eq!(
            cluster.annotations("shop").await,
            map(&[
                ("team", "payments"),
                (RECONCILE_REQUEST_ANNOTATION, &first),
                (ROLLBACK_REVISION_ANNOTATION, "2"),
            ])
        );

        let out = sequenced(k, &["reconcile", "shop", "--force", "--no-wait"]).await;
        let forced = requested(&out, "requested a forced reconcile of apps/shop");
        assert_ne!(forced, first, "a fresh token");
        assert_eq!(
            cluster.annotations("shop").await,
            map(&[
                ("team", "payments"),
                (RECONCILE_REQUEST_ANNOTATION, &forced),
                (FORCE_REQUEST_ANNOTATION, &forced),
                (ROLLBACK_REVISION_ANNOTATION, "2"),
            ])
        );

        let out = sequenced(k, &["rollback", "shop", "3", "--no-wait"]).await;
        let to_3 = requested(&out, "requested a rollback of apps/shop to revision 3");
        assert_eq!(
            cluster.annotations("shop").await,
            map(&[
                ("team", "payments"),
                (RECONCILE_REQUEST_ANNOTATION, &forced),
                (FORCE_REQUEST_ANNOTATION, &forced),
                (ROLLBACK_REQUEST_ANNOTATION, &to_3),
                (ROLLBACK_REVISION_ANNOTATION, "3"),
            ])
        );

        // Without REVISION an earlier revision goes: the operator picks the one before.
        let out = sequenced(k, &["rollback", "shop", "--no-wait"]).await;
        let previous = requested(&out, "requested a rollback of apps/shop");
        assert_eq!(
            cluster.annotations("shop").await,
            map(&[
                ("team", "payments"),
                (RECONCILE_REQUEST_ANNOTATION, &forced),
                (FORCE_REQUEST_ANNOTATION, &forced),
                (ROLLBACK_REQUEST_ANNOTATION, &previous),
            ])
        );

        // Each request was one merge patch of the object; the status is the operator's alone.
        let writes = cluster.command_writes();
        assert_eq!(writes.len(), 4, "{writes:#?}");
        for write in &writes {
            assert_eq!(write.verb, "patch");
            assert_eq!(write.subresource, None);
            assert_eq!(
                write.content_type.as_deref(),
                Some("application/merge-patch+json")
            );
        }
        let status = cluster
            .releases()
            .get("shop")
            .await
            .unwrap()
            .status
            .unwrap();
        assert_eq!(status.revision, Some(4));
        assert_eq!(status.last_handled_reconcile_at, None);
        assert_eq!(status.last_handled_rollback_at, None);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_waits_until_the_operator_has_acted_and_the_release_is_ready() {
    within(async {
        let cluster = Cluster::start().await;
        let failure = "layer app of chart shop failed: Job seed: failed (BackoffLimitExceeded)";
        cluster
            .release(
                "shop",
                json!({}),
                json!({"phase": "Failed", "revision": 2, "message": failure}),
            )
            .await;
        let mut child = spawn(
            &cluster.kubeconfig,
            &["reconcile", "shop", "--timeout", "60s"],
        );
        let token = cluster
            .requested("shop", RECONCILE_REQUEST_ANNOTATION)
            .await;
        assert_rfc3339_nanos(&token);
        // The Failed phase is from before the request: not its outcome.
        cluster
            .still_waiting_after_two_reads("shop", &mut child)
            .await;

        // The operator acts on it: a new revision, not yet done.
        cluster
            .write_status(
                "shop",
                json!({"phase": "Deploying", "revision": 3, "message": "deploying revision 3",
                       "lastHandledReconcileAt": token}),
            )
            .await;
        cluster
            .still_waiting_after_two_reads("shop", &mut child)
            .await;

        cluster
            .write_status(
                "shop",
                json!({"phase": "Ready",
                       "message": "revision 3 (chart version 0.1.0) is ready"}),
            )
            .await;
        let out = finish(child).await;
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(
            stdout(&out),
            "shop: Ready at revision 3: revision 3 (chart version 0.1.0) is ready\n"
        );
        assert_eq!(stderr(&out), "");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_that_fails_exits_1_with_the_message() {
    within(async {
        let cluster = Cluster::start().await;
        cluster
            .release(
                "shop",
                json!({}),
                json!({"phase": "Ready", "revision": 2,
                       "message": "revision 2 (chart version 0.2.0) is ready"}),
            )
            .await;
        let mut child = spawn(
            &cluster.kubeconfig,
            &["rollback", "shop", "1", "--timeout", "60s"],
        );
        let token = cluster.requested("shop", ROLLBACK_REQUEST_ANNOTATION).await;
        assert_eq!(
            cluster.annotations("shop").await[ROLLBACK_REVISION_ANNOTATION],
            "1"
        );
        cluster
            .still_waiting_after_two_reads("shop", &mut child)
            .await;

        cluster
            .write_status(
                "shop",
                json!({"phase": "RollingBack", "revision": 3,
                       "message": "rolling back to revision 1, as requested",
                       "lastHandledRollbackAt": token,
                       "rollback": {"revision": 3, "to": 1, "from": 2, "requested": true}}),
            )
            .await;
        cluster
            .still_waiting_after_two_reads("shop", &mut child)
            .await;

        let failure = "rollback to revision 1 failed: layer db of chart shop failed: \
                       Job migrate: failed (BackoffLimitExceeded)";
        cluster
            .write_status("shop", json!({"phase": "Failed", "message": failure}))
            .await;
        let out = finish(child).await;
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert_eq!(
            stdout(&out),
            format!("shop: Failed at revision 3: {failure}\n")
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_rollback_exits_1_with_the_reason() {
    within(async {
        let cluster = Cluster::start().await;
        cluster
            .release(
                "shop",
                json!({}),
                json!({"phase": "Ready", "revision": 2, "message": "revision 2 is ready"}),
            )
            .await;
        let child = spawn(
            &cluster.kubeconfig,
            &["rollback", "shop", "9", "--timeout", "60s"],
        );
        let token = cluster.requested("shop", ROLLBACK_REQUEST_ANNOTATION).await;
        // Refused: the token is handled, the release stays Ready where it was.
        cluster
            .write_status(
                "shop",
                json!({"message": "rollback refused: there is no revision 9: the latest is 2",
                       "lastHandledRollbackAt": token}),
            )
            .await;
        let out = finish(child).await;
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert_eq!(
            stdout(&out),
            "shop: Ready at revision 2: rollback refused: there is no revision 9: the latest is 2\n"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_nobody_acts_on_times_out_naming_the_release_and_the_token() {
    within(async {
        let cluster = Cluster::start().await;
        cluster
            .release(
                "shop",
                json!({}),
                json!({"phase": "Ready", "revision": 2, "message": "revision 2 is ready"}),
            )
            .await;
        let out = sequenced(
            &cluster.kubeconfig,
            &["reconcile", "shop", "--timeout", "1s"],
        )
        .await;
        let token = &cluster.annotations("shop").await[RECONCILE_REQUEST_ANNOTATION];
        assert_eq!(
            one_line_error(&out),
            format!(
                "error: gave up after 1s waiting for the operator to act on a reconcile of \
                 apps/shop (status.lastHandledReconcileAt is not yet {token}); is the operator \
                 running?"
            )
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_name_what_is_wrong() {
    within(async {
        let cluster = Cluster::start().await;
        let k = &cluster.kubeconfig;
        let out = sequenced(k, &["reconcile", "nowhere"]).await;
        assert_eq!(
            one_line_error(&out),
            "error: SequencedRelease apps/nowhere not found"
        );
        let out = sequenced(k, &["rollback", "nowhere", "2", "-n", "other"]).await;
        assert_eq!(
            one_line_error(&out),
            "error: SequencedRelease other/nowhere not found"
        );

        // Bad arguments are refused before anything is asked.
        let out = sequenced(k, &["rollback", "shop", "0"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(
            stderr(&out).contains("invalid value '0' for '[REVISION]'"),
            "{}",
            stderr(&out)
        );
        let out = sequenced(k, &["rollback", "shop", "two"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(
            stderr(&out).contains("invalid value 'two' for '[REVISION]'"),
            "{}",
            stderr(&out)
        );
        let out = sequenced(k, &["reconcile", "shop", "--timeout", "5 minutes"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(
            stderr(&out).contains("invalid value '5 minutes' for '--timeout <DURATION>'"),
            "{}",
            stderr(&out)
        );
        assert_eq!(cluster.command_writes().len(), 2, "only the two 404s");

        // A cluster without the CRD.
        let bare = TestApiServer::start().await;
        let home = TempDir::new().unwrap();
        let kubeconfig = support::kubeconfig(&home, &bare.url(), "apps");
        let out = sequenced(&kubeconfig, &["rollback", "shop"]).await;
        assert_eq!(
            one_line_error(&out),
            format!(
                "error: the cluster at {}/ does not serve SequencedRelease \
                 (sequenced.dev/v1alpha1): install the CRD with \
                 `sequenced crd | kubectl apply --server-side -f -`",
                bare.url()
            )
        );
    })
    .await;
}

/// The commands against the real controller: the annotations they set are the ones it acts on,
/// and the status it writes ends their wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_and_reconcile_with_the_real_operator() {
    within(async {
        let op = Operator::start(4).await;
        let dir = chart(
            "cli",
            &[("templates/c.yaml", &config_map("c", "helm.sh/layer: c"))],
        );
        op.create(
            "default",
            release("cli", &dir.path().join("cli"), json!({})),
        )
        .await;
        op.wait_release("default", "cli", "Ready", is_ready).await;
        let patch = json!({"spec": {"values": {"n": 2}}});
        op.releases("default")
            .patch("cli", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        op.wait_release("default", "cli", "revision 2", |sr| {
            is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(2)
        })
        .await;
        let home = TempDir::new().unwrap();
        let kubeconfig = support::kubeconfig(&home, &op.server.url(), "default");

        // No revision: the Ready one before the current one.
        let out = sequenced(&kubeconfig, &["rollback", "cli", "--timeout", "50s"]).await;
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(
            stdout(&out),
            "cli: Ready at revision 3: rolled back to revision 1; spec generation 2 not applied\n"
        );
        let sr = op.releases("default").get("cli").await.unwrap();
        let annotations = sr.metadata.annotations.unwrap();
        assert!(!annotations.contains_key(ROLLBACK_REVISION_ANNOTATION));
        assert_eq!(
            sr.status.unwrap().last_handled_rollback_at.as_ref(),
            annotations.get(ROLLBACK_REQUEST_ANNOTATION)
        );

        // A revision that does not exist: refused, exit code 1.
        let out = sequenced(&kubeconfig, &["rollback", "cli", "7", "--timeout", "50s"]).await;
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert_eq!(
            stdout(&out),
            "cli: Ready at revision 3: rollback refused: there is no revision 7: the latest is 3\n"
        );

        // A forced reconcile applies the spec again as a new revision.
        let out = sequenced(
            &kubeconfig,
            &["reconcile", "cli", "--force", "--timeout", "50s"],
        )
        .await;
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stdout(&out)
                .starts_with("cli: Ready at revision 4: revision 4 (chart version 0.1.0) is ready"),
            "{}",
            stdout(&out)
        );
        op.stop().await;
    })
    .await;
}

/// Chart `tested`: a layer Job `check` that fails when the values say `failLayer`; a test Pod
/// `connection` that passes, and a test Job `smoke` that prints `GET /healthz` and, when the
/// values say `broken`, `FAIL: /healthz answered 503` and exits 1.
fn tested_chart() -> TempDir {
    let check = r#"apiVersion: batch/v1
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
          command: ["sh", "-c", "{{ if .Values.failLayer }}echo no; exit 1{{ else }}echo yes{{ end }}"]
"#;
    let connection = r#"apiVersion: v1
kind: Pod
metadata:
  name: connection
  annotations:
    helm.sh/hook: test
spec:
  restartPolicy: Never
  containers:
    - name: wget
      image: busybox:1.36
      command: ["sh", "-c", "echo connected"]
"#;
    let smoke = r#"apiVersion: batch/v1
kind: Job
metadata:
  name: smoke
  annotations:
    helm.sh/hook: test
    helm.sh/hook-weight: "1"
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: smoke
          image: busybox:1.36
          command: ["sh", "-c", "echo GET /healthz; {{ if .Values.broken }}echo 'FAIL: /healthz answered 503'; exit 1{{ else }}echo ok{{ end }}"]
"#;
    chart(
        "tested",
        &[
            ("templates/check.yaml", check),
            ("templates/tests/connection.yaml", connection),
            ("templates/tests/smoke.yaml", smoke),
        ],
    )
}

/// The lines of a `TEST SUITE` block: its name and kind, and its phase line.
fn suites(out: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = out.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("TEST SUITE:     "))
        .map(|(i, l)| {
            let phase = lines.get(i + 3).copied().unwrap_or_default();
            (
                l.trim_start_matches("TEST SUITE:     ").to_string(),
                phase.split(" (").next().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_with_the_real_operator_prints_each_test_and_exits_1_on_a_failure_or_a_refusal() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op
            .server
            .job_controller_running_scripts(Duration::from_millis(50));
        let dir = tested_chart();
        op.create(
            "default",
            release("tested", &dir.path().join("tested"), json!({})),
        )
        .await;
        op.wait_release("default", "tested", "Ready", is_ready).await;
        let home = TempDir::new().unwrap();
        let kubeconfig = support::kubeconfig(&home, &op.server.url(), "default");

        // Every test passes: exit 0, each test as helm test prints it.
        let out = sequenced(&kubeconfig, &["test", "tested", "--timeout", "50s"]).await;
        let printed = stdout(&out);
        assert!(out.status.success(), "{printed}{}", stderr(&out));
        assert_eq!(
            printed.lines().next(),
            Some(
                "tested: Ready at revision 1: revision 1 (chart version 0.1.0) is ready: 1 layers, 1 resources; 2 tests succeeded"
            ),
            "{printed}"
        );
        assert_eq!(
            suites(&printed),
            [
                ("connection (Pod)".to_string(), "Phase:          Succeeded".to_string()),
                ("smoke (Job)".to_string(), "Phase:          Succeeded".to_string()),
            ],
            "{printed}"
        );
        assert!(printed.contains("\nLast Started:   20"), "{printed}");

        // The smoke test fails: exit 1, its message and log lines under it; still Ready.
        op.patch_spec("tested", json!({"values": {"broken": true}}))
            .await;
        op.wait_release("default", "tested", "revision 2 Ready", |sr| {
            is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(2)
        })
        .await;
        let out = sequenced(&kubeconfig, &["test", "tested", "--timeout", "50s"]).await;
        let printed = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{printed}{}", stderr(&out));
        assert!(
            printed.starts_with(
                "tested: Ready at revision 2: revision 2 (chart version 0.1.0) is ready: 1 layers, 1 resources; test Job/smoke failed (run on request)\n"
            ),
            "{printed}"
        );
        assert_eq!(
            suites(&printed),
            [
                ("connection (Pod)".to_string(), "Phase:          Succeeded".to_string()),
                ("smoke (Job)".to_string(), "Phase:          Failed".to_string()),
            ],
            "{printed}"
        );
        let tail: Vec<&str> = printed
            .lines()
            .skip_while(|l| !l.starts_with("Phase:          Failed"))
            .skip(1)
            .collect();
        assert_eq!(tail.len(), 4, "{printed}");
        assert_eq!(
            tail[0],
            "  test hook Job/smoke (chart tested, templates/tests/smoke.yaml) failed: Job smoke: failed (BackoffLimitExceeded: Job has reached the specified backoff limit)"
        );
        assert!(tail[1].starts_with("  last 2 log lines of pod smoke-"), "{printed}");
        assert_eq!(tail[2..], ["  GET /healthz", "  FAIL: /healthz answered 503"]);

        // A Failed release (its Job's template changed, which the API server refuses) is not
        // tested: refused, exit 1, and why.
        op.patch_spec("tested", json!({"values": {"failLayer": true}}))
            .await;
        op.wait_release("default", "tested", "revision 3 Failed", |sr| {
            support::charts::is_stalled(sr) && sr.status.as_ref().unwrap().revision == Some(3)
        })
        .await;
        let out = sequenced(&kubeconfig, &["test", "tested", "--timeout", "50s"]).await;
        let printed = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{printed}{}", stderr(&out));
        assert!(
            printed.starts_with(
                "tested: tests not run: the release is Failed at revision 3, not Ready: applying Job default/check: "
            ),
            "{printed}"
        );
        assert_eq!(printed.lines().count(), 1, "{printed}");
        op.stop().await;
    })
    .await;
}
