//! A release that applied nothing is let go at once when it is deleted, whatever stalled it (a
//! spec that cannot be used, a chart source that cannot be fetched, an unusable kubeconfig):
//! its uninstall writes no record, deletes and reads no object of the chart, and waits for no
//! backoff of the failure that stalled it. (A release stalled `Forbidden` before or after its
//! first layer: tests/tenancy.rs; one in a namespace being deleted: tests/convergence.rs and
//! tests/remote.rs.)

use sequenced_testkit as support;

use std::path::Path;
use std::time::Duration;

use kube::api::DeleteParams;
use serde_json::{Value, json};
use support::charts::{chart, condition, release};
use support::operator::Operator;

/// The namespace of every release here.
const NS: &str = "default";

/// A chart with one ConfigMap.
fn one_map() -> tempfile::TempDir {
    chart(
        "app",
        &[(
            "templates/settings.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: b\n",
        )],
    )
}

/// Waits until a condition of release `name` has `reason`, and returns its message.
async fn until_reason(op: &Operator, name: &str, type_: &str, reason: &str) -> String {
    let sr = op
        .wait_release(NS, name, &format!("{type_} {reason}"), |sr| {
            condition(sr, type_).is_some_and(|(_, r, _)| r == reason)
        })
        .await;
    condition(&sr, type_).map(|(_, _, m)| m).unwrap_or_default()
}

/// Deletes release `name`, and checks that it is gone within a few seconds having touched
/// nothing of the chart: no record written, no object of the chart asked for or deleted.
async fn let_go_at_once(op: &Operator, name: &str) {
    let from = op.server.requests().len();
    op.releases(NS)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    op.wait_deleted_within(NS, name, Duration::from_secs(10))
        .await;
    // The chart's objects by name (its ConfigMap), and Helm's records written or deleted; not
    // the look-up of Helm's records (in Secrets, and in ConfigMaps for Helm's ConfigMap driver)
    // nor the read of the kubeconfig Secret.
    let record = format!("sh.helm.release.v1.{name}.");
    let touched: Vec<String> = op.server.requests()[from..]
        .iter()
        .filter(|r| r.client.as_deref() == Some("test-controller"))
        .filter(|r| {
            let named = r.name.as_deref();
            match r.kind.as_deref() {
                Some("ConfigMap") => named.is_some() || r.verb == "deletecollection",
                Some("Secret") => named.is_some_and(|n| n.starts_with(&record)) && r.verb != "get",
                _ => false,
            }
        })
        .map(|r| format!("{} {}?{} {}", r.verb, r.path, r.query, r.status))
        .collect();
    assert_eq!(touched, Vec::<String>::new(), "release {name}'s uninstall");
    let records = op
        .server
        .objects("v1", "Secret", Some(NS))
        .iter()
        .filter_map(|s| s.pointer("/metadata/name").and_then(Value::as_str))
        .filter(|n| n.starts_with(&format!("sh.helm.release.v1.{name}.")))
        .map(String::from)
        .collect::<Vec<_>>();
    assert_eq!(records, Vec::<String>::new(), "records of {name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_stalled_invalid_spec_is_let_go_at_once() {
    let op = Operator::start(2).await;
    op.create(NS, release("lost", Path::new("/nowhere/app"), json!({})))
        .await;
    let said = until_reason(&op, "lost", "Stalled", "InvalidSpec").await;
    assert!(said.contains("/nowhere/app"), "{said}");
    let_go_at_once(&op, "lost").await;
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_chart_cannot_be_fetched_is_let_go_at_once() {
    let op = Operator::start(2).await;
    // Nothing listens there: every pull fails, retried with backoff.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut sr = release("unfetched", Path::new("/unused"), json!({}));
    sr["spec"]["chart"] = json!({
        "repository": format!("http://127.0.0.1:{port}/charts"),
        "name": "app",
        "version": "1.0.0",
    });
    op.create(NS, sr).await;
    // From the second failure on, the conditions say it (a ChartUnavailable, told as
    // ReconcileFailed with helm's message).
    let said = until_reason(&op, "unfetched", "Ready", "ReconcileFailed").await;
    assert!(said.contains(&format!("127.0.0.1:{port}")), "{said}");
    let_go_at_once(&op, "unfetched").await;
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_kubeconfig_cannot_be_used_is_let_go_at_once() {
    let op = Operator::start(2).await;
    let dir = one_map();
    let spec = json!({"kubeConfig": {"secretRef": {"name": "gone"}}});
    op.create(NS, release("remote", &dir.path().join("app"), spec))
        .await;
    let said = until_reason(&op, "remote", "Stalled", "InvalidKubeConfig").await;
    assert!(said.contains("gone"), "{said}");
    let_go_at_once(&op, "remote").await;
    op.stop().await;
}
