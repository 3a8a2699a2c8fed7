//! The demo's requests to the cluster: whether one answers, its Nodes, the CRD, the demo's
//! namespace, the SequencedReleases it creates, changes, waits for and deletes, their events,
//! and the cleanup.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use sequenced::api::v1alpha1::SequencedRelease;
use sequenced::cli::status::{Outcome, outcome};
use serde_json::{Value, json};

use super::{Error, Result, client};

const CRD_NAME: &str = "sequencedreleases.sequenced.dev";

/// The demo's field manager for the SequencedReleases it applies.
const MANAGER: &str = "sequenced-demo";

/// Exit code 0 and `SERVER (VERSION)` when the current kubeconfig's cluster answers within a few
/// seconds, else 1 and why not.
pub async fn probe() -> Result<u8> {
    let config = match kube::Config::infer().await {
        Ok(config) => config,
        Err(_) => {
            println!("no kubeconfig, and not inside a cluster");
            return Ok(1);
        }
    };
    let url = config.cluster_url.to_string();
    let url = url.trim_end_matches('/');
    let context = kube::config::Kubeconfig::read()
        .ok()
        .and_then(|k| k.current_context)
        .map(|c| format!("context {c}, "))
        .unwrap_or_default();
    let answer = async {
        let client = client().await?;
        client
            .apiserver_version()
            .await
            .map_err(|e| Error(e.to_string()))
    };
    match tokio::time::timeout(Duration::from_secs(8), answer).await {
        Ok(Ok(version)) => {
            println!("{context}{url} ({})", version.git_version);
            Ok(0)
        }
        Ok(Err(e)) => {
            println!("{url} does not answer: {e}");
            Ok(1)
        }
        Err(_) => {
            println!("{url} does not answer within 8 s");
            Ok(1)
        }
    }
}

/// Prints how many Nodes the cluster has.
pub async fn nodes() -> Result<u8> {
    let nodes: Api<Node> = Api::all(client().await?);
    let list = nodes
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("cannot list the Nodes: {e}"))?;
    println!("{}", list.items.len());
    Ok(0)
}

/// Installs the CRD in `file` unless the cluster has one of its name, and waits until it is
/// served; prints `installed` or `present`.
pub async fn crd_ensure(file: &str) -> Result<u8> {
    let client = client().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let present = crds
        .get_opt(CRD_NAME)
        .await
        .map_err(|e| format!("cannot read CustomResourceDefinition {CRD_NAME}: {e}"))?;
    if present.is_some() {
        println!("present");
        return Ok(0);
    }
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {file}: {e}"))?;
    let crd: CustomResourceDefinition =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{file}: not a CRD: {e}"))?;
    crds.create(&PostParams::default(), &crd)
        .await
        .map_err(|e| format!("cannot create CustomResourceDefinition {CRD_NAME}: {e}"))?;
    let releases: Api<SequencedRelease> = Api::all(client);
    let deadline = Instant::now() + Duration::from_secs(60);
    while releases
        .list(&ListParams::default().limit(1))
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            return Err(
                format!("CustomResourceDefinition {CRD_NAME} is not served after 60 s").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("installed");
    Ok(0)
}

/// Deletes the CRD and waits until it is gone.
pub async fn crd_remove() -> Result<u8> {
    let crds: Api<CustomResourceDefinition> = Api::all(client().await?);
    crds.delete(CRD_NAME, &DeleteParams::default())
        .await
        .map_err(|e| format!("cannot delete CustomResourceDefinition {CRD_NAME}: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while crds.get_opt(CRD_NAME).await.ok().flatten().is_some() {
        if Instant::now() > deadline {
            return Err(
                format!("CustomResourceDefinition {CRD_NAME} is still there after 60 s").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(0)
}

/// Creates the namespace, labelled as the demo's; one that exists already is an error (it is
/// someone else's).
pub async fn namespace(name: &str) -> Result<u8> {
    let namespaces: Api<Namespace> = Api::all(client().await?);
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/created-by": "sequenced-demo"}}
    }))
    .map_err(|e| e.to_string())?;
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|e| format!("cannot create namespace {name}: {e}"))?;
    Ok(0)
}

/// Applies the SequencedRelease `name` of the chart directory `chart` with `values` (JSON),
/// server-side, as the demo's field manager: values it no longer gives are removed.
pub async fn apply(namespace: &str, name: &str, chart: &str, values: &str) -> Result<u8> {
    let values: Value =
        serde_json::from_str(values).map_err(|e| format!("values {values:?}: {e}"))?;
    let chart = std::fs::canonicalize(chart).map_err(|e| format!("chart {chart}: {e}"))?;
    let mut release = crate::charts::release(name, &chart, json!({"values": values}));
    release["metadata"]["namespace"] = json!(namespace);
    let releases: Api<SequencedRelease> = Api::namespaced(client().await?, namespace);
    releases
        .patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&release),
        )
        .await
        .map_err(|e| format!("cannot apply SequencedRelease {namespace}/{name}: {e}"))?;
    Ok(0)
}

/// Deletes the SequencedRelease: the operator uninstalls it, then lets it go.
pub async fn delete(namespace: &str, name: &str) -> Result<u8> {
    let releases: Api<SequencedRelease> = Api::namespaced(client().await?, namespace);
    releases
        .delete(name, &DeleteParams::default())
        .await
        .map_err(|e| format!("cannot delete SequencedRelease {namespace}/{name}: {e}"))?;
    Ok(0)
}

/// Waits until the release is Ready (`ready`) or Failed (`failed`) for its current spec, or
/// gone (`gone`), at most `timeout`, and while the process `operator` (when given) lives.
/// Exit code 0 when it got there, 1 when it ended the other way (Failed instead of Ready, or
/// the reverse); an error when it did not end in time or the operator exited.
pub async fn wait(
    namespace: &str,
    name: &str,
    what: &str,
    timeout: Duration,
    operator: Option<u32>,
) -> Result<u8> {
    let wanted = match what {
        "ready" => Some(Outcome::Ready),
        "failed" => Some(Outcome::Failed),
        "gone" => None,
        _ => return Err(format!("wait for ready, failed or gone, not {what:?}").into()),
    };
    let releases: Api<SequencedRelease> = Api::namespaced(client().await?, namespace);
    let deadline = Instant::now() + timeout;
    let mut last = None;
    loop {
        match releases.get_opt(name).await {
            Ok(None) if wanted.is_none() => return Ok(0),
            Ok(Some(release)) => {
                if let Some(ended) = outcome(&release).filter(|_| wanted.is_some()) {
                    return Ok(if Some(ended) == wanted { 0 } else { 1 });
                }
                last = release.status.and_then(|s| s.message);
            }
            Ok(None) => {
                return Err(format!("SequencedRelease {namespace}/{name} is gone").into());
            }
            Err(_) => {}
        }
        if let Some(pid) = operator
            && !alive(pid)
        {
            return Err(format!(
                "the operator (process {pid}) exited while {namespace}/{name} was waited for; see its log"
            )
            .into());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "SequencedRelease {namespace}/{name} is not {what} after {} s; its status says: {}",
                timeout.as_secs(),
                last.unwrap_or_else(|| "nothing yet".into())
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the process `pid` still runs (`kill -0`).
fn alive(pid: u32) -> bool {
    std::process::Command::new("kill")
        .arg("-0")
        .arg(pid.to_string())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Prints the events about the release `name` whose reason is one of `reasons`, oldest first:
/// the reason, then the note (its further lines indented). The operator publishes a step's
/// events just after it writes the step's status, so it waits (at most 15 s) until there is
/// one of each reason.
pub async fn events(namespace: &str, name: &str, reasons: &[&str]) -> Result<u8> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client().await?, namespace);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut found = loop {
        let found: Vec<_> = events
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("cannot list the events of namespace {namespace}: {e}"))?
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.regarding.as_ref().and_then(|r| r.kind.as_deref())
                        == Some("SequencedRelease")
                    && e.reason.as_deref().is_some_and(|r| reasons.contains(&r))
            })
            .collect();
        let every = reasons
            .iter()
            .all(|r| found.iter().any(|e| e.reason.as_deref() == Some(r)));
        if every || Instant::now() > deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    found.sort_by_key(|e| {
        e.event_time
            .as_ref()
            .map(|t| t.0)
            .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    });
    for reason in reasons {
        if !found.iter().any(|e| e.reason.as_deref() == Some(reason)) {
            println!("(no {reason} event after 15 s)");
        }
    }
    for event in found {
        let note = event.note.unwrap_or_default();
        let mut lines = note.lines();
        println!(
            "{}: {}",
            event.reason.unwrap_or_default(),
            lines.next().unwrap_or("")
        );
        for line in lines {
            println!("    {line}");
        }
    }
    Ok(0)
}

/// Uninstalls the SequencedReleases left in the namespace while the operator (process
/// `operator`) runs, then deletes the namespace and waits until it is gone. A release the
/// operator does not let go within a minute, or at all once it has exited, has its finalizer
/// removed, which leaves its objects to the namespace's deletion.
pub async fn cleanup(namespace: &str, operator: Option<u32>) -> Result<u8> {
    let client = client().await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(namespace).await.ok().flatten().is_none() {
        println!("namespace {namespace} is not there");
        return Ok(0);
    }
    let releases: Api<SequencedRelease> = Api::namespaced(client.clone(), namespace);
    let names = |list: kube::core::ObjectList<SequencedRelease>| -> Vec<String> {
        list.items
            .into_iter()
            .filter_map(|r| r.metadata.name)
            .collect()
    };
    let left = releases
        .list(&ListParams::default())
        .await
        .map(names)
        .unwrap_or_default();
    for name in &left {
        let _ = releases.delete(name, &DeleteParams::default()).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = releases
            .list(&ListParams::default())
            .await
            .map(names)
            .unwrap_or_default();
        if left.is_empty() {
            break;
        }
        let operator_gone = operator.is_some_and(|pid| !alive(pid));
        if Instant::now() > deadline || operator_gone {
            let why = if operator_gone {
                "the operator is not running"
            } else {
                "not uninstalled after 60 s"
            };
            println!(
                "{} left and {why}: removing their finalizers; the namespace's deletion takes their objects",
                left.join(", ")
            );
            let patch = json!({"metadata": {"finalizers": null}});
            for name in &left {
                let _ = releases
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    namespaces
        .delete(namespace, &DeleteParams::default())
        .await
        .map_err(|e| format!("cannot delete namespace {namespace}: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Some(left) = namespaces.get_opt(namespace).await.ok().flatten() {
        if let Some(why) = stuck(&left) {
            println!(
                "namespace {namespace}: everything in it is deleted, but the cluster cannot finish \
                 deleting it ({why}); it goes by itself once that is fixed"
            );
            return Ok(0);
        }
        if Instant::now() > deadline {
            return Err(format!("namespace {namespace} is still terminating after 120 s").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("namespace {namespace} deleted");
    Ok(0)
}

/// Why a terminating namespace whose content is all removed cannot go: kube-controller-manager
/// finishes a namespace's deletion only once it could list every API group, so an aggregated
/// API that is down (an APIService whose backend is gone) holds every namespace deletion.
fn stuck(namespace: &Namespace) -> Option<String> {
    let conditions = namespace.status.as_ref()?.conditions.as_ref()?;
    let is = |type_: &str, status: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
    };
    is("NamespaceContentRemaining", "False")?;
    is("NamespaceDeletionDiscoveryFailure", "True").map(|c| c.message.clone().unwrap_or_default())
}
