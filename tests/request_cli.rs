//! `sequenced reconcile` and `sequenced rollback` as a user runs them: the built binary, a
//! kubeconfig that points at the in-process test API server, and a running controller that acts
//! on the requests.

use sequenced_testkit as support;

use std::future::Future;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use sequenced::api::{
    FORCE_REQUEST_ANNOTATION, RECONCILE_REQUEST_ANNOTATION, ROLLBACK_REQUEST_ANNOTATION,
    ROLLBACK_REVISION_ANNOTATION,
};
use serde_json::json;
use support::charts::{chart, config_map, is_ready, release};
use support::operator::Operator;
use tempfile::TempDir;
use tokio::process::Command;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(120), test)
        .await
        .expect("the test did not finish in time");
}

/// Runs `sequenced ARGS` with this kubeconfig and nothing of the environment that could point it
/// at another cluster.
async fn sequenced(kubeconfig: &Path, args: &[&str]) -> Output {
    let home = kubeconfig.parent().expect("kubeconfig dir");
    let child = Command::new(env!("CARGO_BIN_EXE_sequenced"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", home)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run sequenced");
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("sequenced did not exit in time")
        .expect("wait for sequenced")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_and_reconcile_wait_for_the_operator_and_print_the_outcome() {
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
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
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
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            "cli: Ready at revision 3: rollback refused: there is no revision 7: the latest is 3\n"
        );

        // A forced reconcile applies the spec again as a new revision.
        let out = sequenced(
            &kubeconfig,
            &["reconcile", "cli", "--force", "--timeout", "50s"],
        )
        .await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout)
                .starts_with("cli: Ready at revision 4: revision 4 (chart version 0.1.0) is ready"),
            "{}",
            text(&out.stdout)
        );

        // --no-wait only asks; without --force the force annotation goes.
        let out = sequenced(&kubeconfig, &["reconcile", "cli", "--no-wait"]).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(text(&out.stdout).starts_with("requested a reconcile of default/cli (token "));
        let sr = op.releases("default").get("cli").await.unwrap();
        let annotations = sr.metadata.annotations.unwrap();
        assert!(annotations.contains_key(RECONCILE_REQUEST_ANNOTATION));
        assert!(!annotations.contains_key(FORCE_REQUEST_ANNOTATION));
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_name_what_is_wrong() {
    within(async {
        let op = Operator::without_controller().await;
        let home = TempDir::new().unwrap();
        let kubeconfig = support::kubeconfig(&home, &op.server.url(), "default");
        let out = sequenced(&kubeconfig, &["reconcile", "nowhere"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(
            text(&out.stderr),
            "error: SequencedRelease default/nowhere not found\n"
        );
        let out = sequenced(&kubeconfig, &["rollback", "nowhere", "0"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains("invalid value '0'"), "{}", text(&out.stderr));
        // Nobody acts on it: the wait ends, naming what it waited for.
        let dir = chart("idle", &[("templates/c.yaml", &config_map("c", "a: b"))]);
        op.create("default", release("idle", &dir.path().join("idle"), json!({})))
            .await;
        let out = sequenced(&kubeconfig, &["reconcile", "idle", "--timeout", "1s"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(
            text(&out.stderr),
            "error: requested a reconcile of default/idle; gave up after 1s waiting for the operator to act on it\n"
        );
    })
    .await;
}
