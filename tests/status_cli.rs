//! `sequenced status` as a user runs it: the built binary, a kubeconfig that points at the
//! in-process test API server, and SequencedReleases whose status the test writes (or a real
//! controller writes). Exact tree text, JSON, `--watch` exit codes and one-line errors.

use sequenced_testkit as support;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams, PostParams};
use sequenced::api::v1alpha1::{LayerPhase, SequencedRelease};
use serde_json::{Value, json};
use support::apiserver::TestApiServer;
use support::charts::{layer_phase, release};
use support::kubeconfig;
use support::operator::{Operator, install_crd, repo};
use tempfile::TempDir;
use tokio::process::{Child, Command};

const API_VERSION: &str = "sequenced.dev/v1alpha1";
const KIND: &str = "SequencedRelease";

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(120), test)
        .await
        .expect("the test did not finish in time");
}

/// Starts `sequenced status ARGS` with this kubeconfig, stdout and stderr captured, and nothing
/// of the environment that could point it at another cluster.
fn spawn(kubeconfig: &Path, args: &[&str]) -> Child {
    Command::from(support::sequenced_command(
        env!("CARGO_BIN_EXE_sequenced"),
        kubeconfig,
    ))
    .arg("status")
    .args(args)
    .env_remove("NO_COLOR")
    .kill_on_drop(true)
    .spawn()
    .expect("run sequenced")
}

async fn finish(child: Child) -> Output {
    tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("sequenced status did not exit in time")
        .expect("wait for sequenced")
}

async fn status(kubeconfig: &Path, args: &[&str]) -> Output {
    finish(spawn(kubeconfig, args)).await
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
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

/// The test API server with the CRD, the namespace `apps`, and a kubeconfig whose context
/// namespace is `apps`.
struct Cluster {
    server: TestApiServer,
    kubeconfig: PathBuf,
    _dir: TempDir,
}

impl Cluster {
    async fn start() -> Cluster {
        let server = TestApiServer::start().await;
        install_crd(&server.client()).await;
        let namespaces: Api<Namespace> = Api::all(server.client());
        let apps: Namespace =
            serde_json::from_value(json!({"metadata": {"name": "apps"}})).unwrap();
        namespaces
            .create(&PostParams::default(), &apps)
            .await
            .expect("create namespace apps");
        let dir = TempDir::new().expect("temp dir");
        let kubeconfig = kubeconfig(&dir, &server.url(), "apps");
        Cluster {
            server,
            kubeconfig,
            _dir: dir,
        }
    }

    fn releases(&self, namespace: &str) -> Api<SequencedRelease> {
        Api::namespaced(self.server.client(), namespace)
    }

    /// Creates SequencedRelease `namespace/name` of a chart `shop` and writes `status` to it.
    async fn release(&self, namespace: &str, name: &str, status: Value) {
        let object: SequencedRelease =
            serde_json::from_value(release(name, Path::new("/charts/shop"), json!({})))
                .expect("release JSON");
        self.releases(namespace)
            .create(&PostParams::default(), &object)
            .await
            .expect("create the release");
        self.set_status(namespace, name, status);
    }

    fn set_status(&self, namespace: &str, name: &str, status: Value) {
        assert!(
            self.server
                .set_status(API_VERSION, KIND, Some(namespace), name, status),
            "{namespace}/{name} exists"
        );
    }

    /// The status as the server keeps it.
    fn stored_status(&self, namespace: &str, name: &str) -> Value {
        self.server
            .object(API_VERSION, KIND, Some(namespace), name)
            .expect("the release")["status"]
            .clone()
    }

    /// Waits until `sequenced status --watch` has its watch open, so that what the test writes
    /// next arrives as a change.
    async fn wait_for_watch(&self, child: &mut Child) {
        let opened = self
            .server
            .wait_until(Duration::from_secs(20), |s| status_watches(s) > 0)
            .await;
        if !opened {
            child.start_kill().ok();
            panic!("sequenced status --watch never watched");
        }
        assert!(
            child.try_wait().expect("poll").is_none(),
            "sequenced status --watch exited before the release was Ready"
        );
    }
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2025-06-01T12:00:00Z"})
}

fn layer(chart: &str, name: &str, phase: &str, ready: i32, resources: i32) -> Value {
    let mut layer = json!({"chart": chart, "name": name, "phase": phase, "resources": resources,
                           "ready": ready, "startedAt": "2025-06-01T12:00:02Z"});
    if matches!(phase, "Ready" | "Failed" | "Deleted") {
        layer["finishedAt"] = json!("2025-06-01T12:00:09Z");
    }
    layer
}

fn with_message(mut layer: Value, message: &str) -> Value {
    layer["message"] = json!(message);
    layer
}

/// Revision 3 of chart shop in progress: CRDs done, subcharts postgres and payments (with its own
/// subchart ledger), the queue not yet available, app waiting for it, prune still to come, and the
/// lock held by a controller.
fn deploying() -> Value {
    json!({
        "observedGeneration": 1,
        "phase": "Deploying",
        "revision": 3,
        "lastAppliedDigest": "sha256:5f0c1e9a",
        "message": "deploying revision 3",
        "progress": "4/7",
        "conditions": [
            condition("Ready", "False", "Progressing", "deploying revision 3"),
            condition("Reconciling", "True", "Progressing", "deploying revision 3"),
            condition("Stalled", "False", "Progressing", ""),
        ],
        "layers": [
            layer("shop", "(crds)", "Ready", 2, 2),
            layer("shop/postgres", "(default)", "Ready", 3, 3),
            layer("shop/payments/ledger", "(default)", "Ready", 1, 1),
            layer("shop/payments", "db-migrate", "Ready", 1, 1),
            with_message(layer("shop/payments", "api", "Waiting", 2, 3),
                "waiting for Deployment payments-api: 1 of 2 replicas available"),
            layer("shop", "database", "Ready", 2, 2),
            with_message(layer("shop", "queue", "Waiting", 1, 2),
                "waiting for Deployment queue-processor: 0 of 1 replicas available"),
            with_message(layer("shop", "app", "Pending", 0, 2),
                "waiting for Deployment queue-processor (chart shop) to be ready"),
            layer("shop", "(prune)", "Pending", 0, 2),
        ],
        "lock": {"holder": "sequenced-7d4b9c-x2l8q", "sessionId": "b41f07",
                 "lockedUntil": "2025-06-01T12:05:00Z"},
        "history": [
            {"revision": 3, "chartVersion": "1.4.0", "digest": "sha256:5f0c1e9a",
             "phase": "Deploying", "startedAt": "2025-06-01T12:00:00Z", "sequenced": true},
            {"revision": 2, "chartVersion": "1.3.2", "digest": "sha256:0d2a7713",
             "phase": "Ready", "startedAt": "2025-05-30T08:00:00Z",
             "finishedAt": "2025-05-30T08:01:12Z", "sequenced": true}
        ]
    })
}

/// What the operator writes when revision 3 is done: every layer Ready, the lock cleared.
fn ready() -> Value {
    let mut status = deploying();
    status["phase"] = json!("Ready");
    status["message"] = json!("revision 3 is ready");
    status["progress"] = json!("7/7");
    status["conditions"] = json!([
        condition("Ready", "True", "Succeeded", "revision 3 is ready"),
        condition("Reconciling", "False", "Succeeded", ""),
        condition("Stalled", "False", "Succeeded", ""),
    ]);
    let mut layers = status["layers"].as_array().cloned().unwrap_or_default();
    for layer in &mut layers {
        layer["phase"] = json!("Ready");
        layer["ready"] = layer["resources"].clone();
        layer["finishedAt"] = json!("2025-06-01T12:01:30Z");
        if let Some(layer) = layer.as_object_mut() {
            layer.remove("message");
        }
    }
    status["layers"] = json!(layers);
    status["lock"] = Value::Null;
    status["history"][0]["phase"] = json!("Ready");
    status
}

/// The app layer's Job failed: the release is Failed and Stalled.
fn failed() -> Value {
    let mut status = deploying();
    let reason =
        "Job app-seed: failed (BackoffLimitExceeded: Job has reached the specified backoff limit)";
    let message = format!("layer app of chart shop failed: {reason}");
    status["phase"] = json!("Failed");
    status["message"] = json!(message);
    status["conditions"] = json!([
        condition("Ready", "False", "ReadinessFailed", &message),
        condition("Reconciling", "False", "ReadinessFailed", ""),
        condition("Stalled", "True", "ReadinessFailed", &message),
    ]);
    status["layers"][7] = with_message(layer("shop", "app", "Failed", 1, 2), reason);
    status["lock"] = Value::Null;
    status
}

const DEPLOYING_TREE: &str = "\
SequencedRelease apps/shop
PHASE        Deploying
REVISION     3
READY        False (Progressing)
PROGRESS     4/7 layers ready
MESSAGE      deploying revision 3
LOCK HOLDER  sequenced-7d4b9c-x2l8q (session b41f07)
LOCKED TILL  2025-06-01T12:05:00Z

(crds)                 [████████] 2/2  Ready
shop
├── database           [████████] 2/2  Ready
├── queue              [████░░░░] 1/2  Waiting
│     waiting for Deployment queue-processor: 0 of 1 replicas available
├── app                [░░░░░░░░] 0/2  Pending
│     waiting for Deployment queue-processor (chart shop) to be ready
├── postgres
│   └── (default)      [████████] 3/3  Ready
└── payments
    ├── db-migrate     [████████] 1/1  Ready
    ├── api            [█████░░░] 2/3  Waiting
    │     waiting for Deployment payments-api: 1 of 2 replicas available
    └── ledger
        └── (default)  [████████] 1/1  Ready
(prune)                [░░░░░░░░] 0/2  Pending
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tree_shows_the_header_the_lock_and_every_layer_under_its_chart() {
    within(async {
        let cluster = Cluster::start().await;
        cluster.release("apps", "shop", deploying()).await;
        // The namespace comes from the kubeconfig's context.
        let output = status(&cluster.kubeconfig, &["shop"]).await;
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert_eq!(stdout(&output), DEPLOYING_TREE);
        assert!(stderr(&output).is_empty(), "{}", stderr(&output));
        // -o tree is the default.
        let output = status(&cluster.kubeconfig, &["shop", "-o", "tree"]).await;
        assert_eq!(stdout(&output), DEPLOYING_TREE);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tree_of_a_failed_release_names_what_failed_and_still_exits_0_without_watch() {
    within(async {
        let cluster = Cluster::start().await;
        cluster.release("apps", "shop", failed()).await;
        let output = status(&cluster.kubeconfig, &["shop"]).await;
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let text = stdout(&output);
        assert!(
            text.starts_with(
                "SequencedRelease apps/shop\nPHASE        Failed\nREVISION     3\n\
                 READY        False (ReadinessFailed)\nSTALLED      True (ReadinessFailed)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "├── app                [████░░░░] 1/2  Failed\n│     Job app-seed: failed \
                 (BackoffLimitExceeded: Job has reached the specified backoff limit)\n"
            ),
            "{text}"
        );
        assert!(!text.contains("LOCK HOLDER"), "{text}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_is_the_status_of_the_release_in_the_namespace_given() {
    within(async {
        let cluster = Cluster::start().await;
        cluster.release("default", "shop", deploying()).await;
        let output = status(
            &cluster.kubeconfig,
            &["shop", "-n", "default", "-o", "json"],
        )
        .await;
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let printed: Value = serde_json::from_str(&stdout(&output)).expect("JSON");
        let stored = cluster.stored_status("default", "shop");
        assert_eq!(printed, stored);
        assert_eq!(printed["layers"][4]["name"], "api");
        // Pretty: one field per line.
        assert!(stdout(&output).contains("\n  \"phase\": \"Deploying\",\n"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_redraws_each_change_and_exits_0_when_ready() {
    within(async {
        let cluster = Cluster::start().await;
        cluster.release("apps", "shop", deploying()).await;
        let mut child = spawn(&cluster.kubeconfig, &["shop", "--watch"]);
        cluster.wait_for_watch(&mut child).await;

        // The queue becomes available; then everything is.
        let mut queue_ready = deploying();
        queue_ready["layers"][6] = layer("shop", "queue", "Ready", 2, 2);
        queue_ready["layers"][7] = layer("shop", "app", "Waiting", 0, 2);
        queue_ready["progress"] = json!("5/7");
        cluster.set_status("apps", "shop", queue_ready);
        cluster.set_status("apps", "shop", ready());

        let output = finish(child).await;
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let text = stdout(&output);
        let states: Vec<&str> = text.split("\n\nSequencedRelease ").collect();
        assert_eq!(states.len(), 3, "three states, a blank line apart:\n{text}");
        assert!(text.starts_with(DEPLOYING_TREE), "{text}");
        assert!(
            states[1].contains("PROGRESS     5/7 layers ready\n")
                && states[1].contains("├── queue              [████████] 2/2  Ready\n"),
            "{}",
            states[1]
        );
        assert!(
            states[2].starts_with("apps/shop\nPHASE        Ready\nREVISION     3\nREADY        True (Succeeded)\nPROGRESS     7/7 layers ready\n"),
            "{}",
            states[2]
        );
        assert!(!states[2].contains("LOCK HOLDER"), "{}", states[2]);
        assert!(stderr(&output).is_empty(), "{}", stderr(&output));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_exits_1_when_the_release_fails() {
    within(async {
        let cluster = Cluster::start().await;
        cluster.release("apps", "shop", deploying()).await;
        let mut child = spawn(&cluster.kubeconfig, &["shop", "-w"]);
        cluster.wait_for_watch(&mut child).await;
        cluster.set_status("apps", "shop", failed());
        let output = finish(child).await;
        assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
        let text = stdout(&output);
        let states: Vec<&str> = text.split("\n\nSequencedRelease ").collect();
        assert_eq!(states.len(), 2, "{text}");
        assert!(
            states[1].starts_with("apps/shop\nPHASE        Failed\n"),
            "{text}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_ends_at_once_for_a_release_already_ready_and_waits_out_a_stale_status() {
    within(async {
        let cluster = Cluster::start().await;
        cluster.release("apps", "shop", ready()).await;
        let output = status(&cluster.kubeconfig, &["shop", "--watch"]).await;
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert_eq!(
            stdout(&output)
                .matches("SequencedRelease apps/shop")
                .count(),
            1
        );

        // A new spec: the Ready status is of generation 1, so the watch goes on until the
        // operator has written one for generation 2.
        let patch = json!({"spec": {"values": {"replicas": 2}}});
        cluster
            .releases("apps")
            .patch("shop", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch the spec");
        let mut child = spawn(&cluster.kubeconfig, &["shop", "--watch", "-o", "json"]);
        cluster.wait_for_watch(&mut child).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            child.try_wait().expect("poll").is_none(),
            "ended on a stale Ready"
        );
        let mut current = ready();
        current["observedGeneration"] = json!(2);
        cluster.set_status("apps", "shop", current);
        let output = finish(child).await;
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        // Two JSON documents: generation 1's status, then generation 2's.
        let documents: Vec<Value> = serde_json::Deserializer::from_str(&stdout(&output))
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .expect("a stream of JSON documents");
        assert_eq!(documents.len(), 2, "{}", stdout(&output));
        assert_eq!(documents[0]["observedGeneration"], 1);
        assert_eq!(documents[1]["observedGeneration"], 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_says_so_when_the_release_is_deleted() {
    within(async {
        let cluster = Cluster::start().await;
        cluster.release("apps", "shop", deploying()).await;
        let mut child = spawn(&cluster.kubeconfig, &["shop", "--watch"]);
        cluster.wait_for_watch(&mut child).await;
        cluster
            .releases("apps")
            .delete("shop", &Default::default())
            .await
            .expect("delete");
        let output = finish(child).await;
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        assert_eq!(
            stderr(&output),
            "error: SequencedRelease apps/shop was deleted\n"
        );
        assert!(stdout(&output).starts_with(DEPLOYING_TREE));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_release_is_one_line_and_exit_2() {
    within(async {
        let cluster = Cluster::start().await;
        let output = status(&cluster.kubeconfig, &["absent"]).await;
        assert_eq!(
            one_line_error(&output),
            "error: SequencedRelease apps/absent not found"
        );
        let output = status(&cluster.kubeconfig, &["absent", "-n", "default", "--watch"]).await;
        assert_eq!(
            one_line_error(&output),
            "error: SequencedRelease default/absent not found"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_the_crd_says_to_install_it() {
    within(async {
        let server = TestApiServer::start().await;
        let dir = TempDir::new().unwrap();
        let kubeconfig = kubeconfig(&dir, &server.url(), "default");
        let output = status(&kubeconfig, &["shop"]).await;
        let line = one_line_error(&output);
        assert!(
            line.starts_with(&format!(
                "error: the cluster at {}/ does not serve SequencedRelease (sequenced.dev/v1alpha1): install the CRD",
                server.url()
            )),
            "{line}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cluster_is_one_line_and_exit_2() {
    within(async {
        let dir = TempDir::new().unwrap();
        // No kubeconfig at all, and not in a pod.
        let output = status(&dir.path().join("absent-kubeconfig"), &["shop"]).await;
        let line = one_line_error(&output);
        assert!(
            line.starts_with("error: no cluster to talk to (kubeconfig or in-cluster config): "),
            "{line}"
        );
        // A kubeconfig whose server does not answer.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let kubeconfig = kubeconfig(&dir, &url, "apps");
        let output = status(&kubeconfig, &["shop"]).await;
        let line = one_line_error(&output);
        assert!(
            line.starts_with(&format!(
                "error: cannot read SequencedRelease apps/shop from {url}/: "
            )),
            "{line}"
        );
    })
    .await;
}

/// The status a real controller writes: examples/foo (subcharts nginx, rabbitmq and bar) while
/// its first layers wait for their Deployments, then `--watch` until the kubelet has made
/// everything ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shows_what_the_controller_writes_for_the_subchart_example() {
    within(async {
        let op = Operator::start(2).await;
        let dir = TempDir::new().unwrap();
        let kubeconfig = kubeconfig(&dir, &op.server.url(), "default");
        op.create(
            "default",
            release("foo", &repo().join("examples/foo"), json!({})),
        )
        .await;
        op.wait_release("default", "foo", "nginx and rabbitmq waiting", |sr| {
            let layers = &sr
                .status
                .as_ref()
                .map(|s| s.layers.clone())
                .unwrap_or_default();
            let waiting = |chart: &str| {
                layers.iter().any(|l| {
                    l.chart == chart && l.phase == LayerPhase::Waiting && l.message.is_some()
                })
            };
            waiting("foo/nginx")
                && waiting("foo/rabbitmq")
                && layer_phase(sr, "(default)").is_some()
        })
        .await;

        let output = status(&kubeconfig, &["foo"]).await;
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let text = stdout(&output);
        println!("{text}");
        let tree = text
            .split_once("\n\n")
            .map(|(_, tree)| tree)
            .unwrap_or_default();
        let lines: Vec<&str> = tree.lines().collect();
        assert_eq!(lines[0], "foo", "{text}");
        assert!(
            lines[1].starts_with("├── bar") || lines[1].starts_with("├── (default)"),
            "{text}"
        );
        for chart in ["nginx", "rabbitmq"] {
            let at = lines
                .iter()
                .position(|l| l.ends_with(&format!("── {chart}")))
                .unwrap_or_else(|| panic!("{chart} in\n{text}"));
            assert!(
                lines[at + 1].contains("── (default)") && lines[at + 1].ends_with("Waiting"),
                "{text}"
            );
            assert!(
                lines[at + 2].contains("waiting for Deployment foo-"),
                "{text}"
            );
        }

        let child = spawn(&kubeconfig, &["foo", "--watch"]);
        let _kubelet = op.kubelet();
        let output = finish(child).await;
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let text = stdout(&output);
        println!("{text}");
        let last = text
            .rsplit("\n\nSequencedRelease ")
            .next()
            .unwrap_or_default();
        assert!(last.contains("\nPHASE        Ready\n"), "{text}");
        assert!(last.contains("\nPROGRESS     4/4 layers ready\n"), "{text}");
        let tree = last
            .split_once("\n\n")
            .map(|(_, tree)| tree)
            .unwrap_or_default();
        assert_eq!(
            tree,
            "\
foo
├── (default)      [████████] 2/2  Ready
├── nginx
│   └── (default)  [████████] 2/2  Ready
├── rabbitmq
│   └── (default)  [████████] 2/2  Ready
└── bar
    └── (default)  [████████] 2/2  Ready
",
            "{text}"
        );
        op.stop().await;
    })
    .await;
}

/// How many watches of one SequencedRelease by name the server got: those of
/// `sequenced status --watch` (the controller watches them all).
fn status_watches(server: &TestApiServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| {
            r.verb == "watch"
                && r.kind.as_deref() == Some(KIND)
                && r.query.contains("fieldSelector=metadata.name")
        })
        .count()
}

/// The README's sample is the output the tree test gets from the binary.
#[test]
fn the_readme_sample_is_real_output() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let fence = "```text\nSequencedRelease apps/shop\n";
    let start = readme.find(fence).expect("the sample in README.md") + "```text\n".len();
    let end = start + readme[start..].find("```").expect("the end of the sample");
    assert_eq!(&readme[start..end], DEPLOYING_TREE);
}
