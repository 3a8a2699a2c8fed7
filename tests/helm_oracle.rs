//! The real `helm` as the oracle of sequenced's hooks (STYLE.md "Habits"): each pattern chart in
//! tests/charts/hook-patterns/ is installed, upgraded, rolled back and uninstalled by `helm`
//! against one fresh test API server, and by sequenced (a SequencedRelease with `sequencing:
//! none`, everything at once as plain Helm, same release name, namespace and values) against
//! another, each with the testkit playing the Job controller, the kubelet and the Deployment
//! controller. After every operation the two servers are compared on:
//!
//! 1. the order of the successful writes to the chart's hook objects (create and server-side
//!    apply both count as `create`, then `delete`), as `(verb, Kind/name)`;
//! 2. the objects left: `(group, kind, namespace, name)` of everything in the release
//!    namespace, and of the cluster-scoped kinds the chart renders, without the bookkeeping that
//!    legitimately differs (see [`bookkeeping`]).
//!
//! A mismatch fails with both sides printed next to each other, every operation of the
//! scenario at once. Nothing here asserts our reading of Helm's documentation: what helm did is
//! the expectation. The helm side must itself succeed (or fail where the pattern fails), so a
//! scenario whose oracle misbehaves fails as such, not as a difference.
//!
//! Adding a pattern: a chart directory under tests/charts/hook-patterns/<name>/ and one
//! `#[tokio::test]` calling [`compare`] with its operations.

use sequenced_testkit as support;

use std::collections::BTreeSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use sequenced::api::v1alpha1::{ReleasePhase, SequencedRelease};
use sequenced::api::{
    ROLLBACK_REQUEST_ANNOTATION, ROLLBACK_REVISION_ANNOTATION, TEST_REQUEST_ANNOTATION,
};
use serde_json::{Value, json};
use support::charts::{condition, is_ready, release};
use support::operator::{Operator, is_write};
use tempfile::TempDir;

/// The namespace every release is installed in (its own, so nothing of `default` mixes in).
const NAMESPACE: &str = "apps";

/// How long the emulated Job controller lets a hook Job (or Pod) run before it completes.
const JOB_RUNS: Duration = Duration::from_millis(100);

/// helm's `--timeout` and sequenced's `spec.timeout`: short enough that a hung side fails the
/// scenario well inside [`SCENARIO`], long enough for a loaded machine.
const OPERATION_TIMEOUT: &str = "20s";

/// How long one side may take for one operation before it is reported as stuck.
const OPERATION_DEADLINE: Duration = Duration::from_secs(25);

/// The whole scenario: both sides run at once, each operation bounded by the above.
const SCENARIO: Duration = Duration::from_secs(55);

/// After an operation ended, how long to let late writes (a hook delete sent after the status
/// said Ready) arrive before the request log and the objects are read.
const SETTLE: Duration = Duration::from_millis(300);

/// One operation of a scenario, run by both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operation {
    /// `helm install --wait` / creating the SequencedRelease and waiting for Ready.
    Install,
    /// `helm install` that must fail (a failing hook) / the release ends Failed, `HookFailed`.
    FailedInstall,
    /// `helm upgrade --wait --set level=2` / `spec.values: {level: 2}`, waiting for Ready.
    Upgrade,
    /// `helm rollback NAME 1 --wait` / the rollback request annotations for revision 1.
    Rollback,
    /// `helm uninstall --wait` / deleting the SequencedRelease and waiting until it is gone.
    Uninstall,
    /// `helm test` / the test request annotation (`sequenced test`), waiting until its run
    /// passed.
    Test,
    /// `helm test` that must fail (a failing test) / the run ends with `TestSuccess` False.
    FailedTest,
}

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Operation::Install => "install",
            Operation::FailedInstall => "install (failing)",
            Operation::Upgrade => "upgrade",
            Operation::Rollback => "rollback to 1",
            Operation::Uninstall => "uninstall",
            Operation::Test => "test",
            Operation::FailedTest => "test (failing)",
        }
    }
}

/// The usual life of a release whose hooks all succeed.
const LIFECYCLE: &[Operation] = &[
    Operation::Install,
    Operation::Upgrade,
    Operation::Rollback,
    Operation::Uninstall,
];

/// What one side did in one operation.
#[derive(Debug, Default)]
struct Observed {
    /// `create Kind/name` and `delete Kind/name`, in the order the server answered them.
    hook_writes: Vec<String>,
    /// `group/Kind namespace/name` (group empty for the core group, namespace `-` when
    /// cluster-scoped), sorted.
    objects: BTreeSet<String>,
    /// How the operation ended, when not as it should have (sequenced's side only; the oracle
    /// fails the test at once).
    trouble: Option<String>,
    /// [`hook_requests`], for `SEQUENCED_ORACLE_TRACE`.
    requests: Vec<String>,
    /// After a test run, what `helm status` prints of it: the `TEST SUITE` and `Phase` lines
    /// (the times aside), read by the real helm from each side's release record.
    test_suites: Vec<String>,
}

fn chart_dir(pattern: &str) -> PathBuf {
    support::charts::repo()
        .join("tests/charts/hook-patterns")
        .join(pattern)
}

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(SCENARIO, test)
        .await
        .expect("the scenario did not finish in time");
}

/// The chart's rendering as helm prints it for `release` in [`NAMESPACE`]: every document's
/// (kind, name, is a hook).
fn rendered(pattern: &str, release: &str) -> Vec<(String, String, bool)> {
    let out = std::process::Command::new(support::helm())
        .args(["template", release])
        .arg(chart_dir(pattern))
        .args(["--namespace", NAMESPACE, "--include-crds"])
        .output()
        .expect("run helm template");
    assert!(
        out.status.success(),
        "helm template {pattern}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut documents = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(document).expect("helm's YAML");
        let (Some(kind), Some(name)) = (
            value["kind"].as_str(),
            value.pointer("/metadata/name").and_then(Value::as_str),
        ) else {
            continue;
        };
        let hook = value
            .pointer("/metadata/annotations/helm.sh~1hook")
            .is_some();
        documents.push((kind.to_string(), name.to_string(), hook));
    }
    documents
}

/// What both sides look at: the hook objects by `Kind/name`, and the kinds the chart renders
/// (for the cluster-scoped objects it makes).
struct Watched {
    hooks: BTreeSet<String>,
    kinds: BTreeSet<String>,
}

fn scope(pattern: &str, release: &str) -> Watched {
    let documents = rendered(pattern, release);
    Watched {
        hooks: documents
            .iter()
            .filter(|d| d.2)
            .map(|(kind, name, _)| format!("{kind}/{name}"))
            .collect(),
        kinds: documents.iter().map(|d| d.0.clone()).collect(),
    }
}

/// The successful writes to hook objects among the requests from `from` on.
fn hook_writes(op: &Operator, from: usize, scope: &Watched) -> Vec<String> {
    op.server
        .requests()
        .iter()
        .skip(from)
        .filter(|r| is_write(r) && r.status < 300 && r.subresource.is_none())
        .filter_map(|r| {
            let verb = match r.verb {
                "create" | "apply" => "create",
                "delete" => "delete",
                _ => return None,
            };
            let target = target(r);
            scope
                .hooks
                .contains(&target)
                .then(|| format!("{verb} {target}"))
        })
        .collect()
}

fn target(r: &support::apiserver::RecordedRequest) -> String {
    format!(
        "{}/{}",
        r.kind.as_deref().unwrap_or_default(),
        r.name.as_deref().unwrap_or_default()
    )
}

/// Every write to a hook object from `from` on, as sent and answered (`apply Job/x -> 201`,
/// `delete Job/x -> 404`): printed with the report when `SEQUENCED_ORACLE_TRACE` is set, to
/// see what each side did beyond the compared list.
fn hook_requests(op: &Operator, from: usize, scope: &Watched) -> Vec<String> {
    op.server
        .requests()
        .iter()
        .skip(from)
        .filter(|r| is_write(r) && scope.hooks.contains(&target(r)))
        .map(|r| {
            let sub = r
                .subresource
                .as_deref()
                .map(|s| format!("/{s}"))
                .unwrap_or_default();
            format!("{} {}{sub} -> {}", r.verb, target(r), r.status)
        })
        .collect()
}

/// Objects that are not what a chart's hooks or resources made, and that helm and sequenced
/// legitimately keep differently, so they are left out of the comparison:
/// - release records: Helm's `sh.helm.release.v1.*` Secrets (sequenced writes records in the
///   same format, but when and how many differs by design: a failed sequenced operation may be
///   retried as a new revision) and sequenced's earlier `sequenced.release.v1.*`;
/// - the SequencedRelease itself (only sequenced has one) and its CRD;
/// - Leases (sequenced's release lock) and Events (each tool reports in its own words);
/// - what the cluster makes in every namespace: the `default` ServiceAccount and the
///   `kube-root-ca.crt` ConfigMap, when the server makes them;
/// - Pods a Job controller made for a hook Job: their lifetime is the garbage collector's (a
///   Job deleted with background propagation leaves them to it), not helm's or sequenced's.
///   A Pod that is itself a hook is compared.
fn bookkeeping(group: &str, kind: &str, object: &DynamicObject) -> bool {
    let name = object.metadata.name.as_deref().unwrap_or_default();
    match (group, kind) {
        ("", "Secret") => {
            name.starts_with("sh.helm.release.v1.") || name.starts_with("sequenced.release.v1.")
        }
        ("sequenced.dev", _) | ("coordination.k8s.io", "Lease") => true,
        ("apiextensions.k8s.io", "CustomResourceDefinition") => name.ends_with(".sequenced.dev"),
        ("" | "events.k8s.io", "Event") => true,
        ("", "ServiceAccount") => name == "default",
        ("", "ConfigMap") => name == "kube-root-ca.crt",
        ("", "Pod") => object
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Job"),
        _ => false,
    }
}

/// Everything in [`NAMESPACE`], and every object of a cluster-scoped kind the chart renders,
/// found through discovery as a client would, less [`bookkeeping`].
async fn objects(op: &Operator, scope: &Watched) -> BTreeSet<String> {
    let client = op.server.client();
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let mut found = BTreeSet::new();
    for group in discovery.groups() {
        for (resource, caps) in group.recommended_resources() {
            if !caps.supports_operation(kube::discovery::verbs::LIST) {
                continue;
            }
            let api: Api<DynamicObject> = match caps.scope {
                Scope::Namespaced => Api::namespaced_with(client.clone(), NAMESPACE, &resource),
                Scope::Cluster if scope.kinds.contains(&resource.kind) => {
                    Api::all_with(client.clone(), &resource)
                }
                Scope::Cluster => continue,
            };
            let list = api
                .list(&ListParams::default())
                .await
                .unwrap_or_else(|e| panic!("list {}: {e}", resource.plural));
            for object in list.items {
                if bookkeeping(&resource.group, &resource.kind, &object) {
                    continue;
                }
                found.insert(format!(
                    "{}/{} {}/{}",
                    resource.group,
                    resource.kind,
                    object.metadata.namespace.as_deref().unwrap_or("-"),
                    object.metadata.name.as_deref().unwrap_or_default()
                ));
            }
        }
    }
    found
}

/// A fresh server with the testkit's Job controller, kubelet and Deployment controller, the
/// release namespace created; with sequenced's controller running or not.
async fn cluster(
    controller: bool,
) -> (
    Operator,
    support::operator::Kubelet,
    support::operator::Kubelet,
) {
    let op = if controller {
        Operator::start(2).await
    } else {
        Operator::without_controller().await
    };
    op.namespace(NAMESPACE).await;
    let jobs = op.job_controller(JOB_RUNS);
    let deployments = op.kubelet();
    (op, jobs, deployments)
}

/// Runs helm with `args` (plus the kubeconfig and namespace) and returns whether it succeeded
/// and what it printed.
async fn helm(home: &Path, url: &str, args: Vec<String>) -> (bool, String) {
    let home = home.to_path_buf();
    let url = url.to_string();
    tokio::task::spawn_blocking(move || {
        let dir = TempDir::new_in(&home).expect("temp dir");
        let kubeconfig = support::kubeconfig(&dir, &url, NAMESPACE);
        let out = std::process::Command::new(support::helm())
            .args(&args)
            .args(["--namespace", NAMESPACE, "--kubeconfig"])
            .arg(&kubeconfig)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .output()
            .expect("run helm");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    })
    .await
    .expect("helm task")
}

/// The oracle: helm runs `operations` on chart `pattern` as release `name`. Helm failing where
/// it should succeed, or succeeding where it should fail, fails the test: the oracle is then
/// not to be trusted.
async fn helm_side(
    pattern: &str,
    name: &str,
    operations: &[Operation],
    scope: &Watched,
) -> Vec<Observed> {
    let (op, _jobs, _deployments) = cluster(false).await;
    let home = TempDir::new().expect("helm home");
    let chart = chart_dir(pattern).display().to_string();
    let mut seen = Vec::new();
    for operation in operations {
        let from = op.server.requests().len();
        let timeout = ["--timeout".to_string(), OPERATION_TIMEOUT.to_string()];
        let mut args: Vec<String> = match operation {
            Operation::Install | Operation::FailedInstall => {
                vec![
                    "install".into(),
                    name.into(),
                    chart.clone(),
                    "--wait".into(),
                ]
            }
            Operation::Upgrade => vec![
                "upgrade".into(),
                name.into(),
                chart.clone(),
                "--wait".into(),
                "--set".into(),
                "level=2".into(),
            ],
            Operation::Rollback => {
                vec!["rollback".into(), name.into(), "1".into(), "--wait".into()]
            }
            Operation::Uninstall => vec!["uninstall".into(), name.into(), "--wait".into()],
            Operation::Test | Operation::FailedTest => vec!["test".into(), name.into()],
        };
        args.extend(timeout);
        let started = Instant::now();
        let (ok, text) = helm(home.path(), &op.server.url(), args.clone()).await;
        let expected = !matches!(operation, Operation::FailedInstall | Operation::FailedTest);
        assert_eq!(
            ok,
            expected,
            "the oracle: helm {args:?} {} after {:?}:\n{text}\nits last requests:\n{}",
            if ok { "succeeded" } else { "failed" },
            started.elapsed(),
            last_requests(&op, from)
        );
        // It failed for the reason the pattern is about, not for another.
        assert!(
            ok || text.contains("failed pre-install") || text.contains("Phase:          Failed"),
            "the oracle: helm {args:?} failed, but not in a pre-install hook or a test:\n{text}"
        );
        tokio::time::sleep(SETTLE).await;
        seen.push(Observed {
            hook_writes: hook_writes(&op, from, scope),
            objects: objects(&op, scope).await,
            trouble: None,
            requests: hook_requests(&op, from, scope),
            test_suites: test_suites(home.path(), &op.server.url(), name, *operation).await,
        });
    }
    seen
}

/// The `TEST SUITE` and `Phase` lines of `helm status NAME` on the server at `url`, after a
/// test run (nothing for other operations).
async fn test_suites(home: &Path, url: &str, name: &str, operation: Operation) -> Vec<String> {
    if !matches!(operation, Operation::Test | Operation::FailedTest) {
        return Vec::new();
    }
    let (ok, text) = helm(home, url, vec!["status".into(), name.into()]).await;
    assert!(ok, "helm status {name}: {text}");
    text.lines()
        .filter(|l| l.starts_with("TEST SUITE") || l.starts_with("Phase:"))
        .map(str::to_string)
        .collect()
}

/// The last requests from `from` on, one line each, for a report on the oracle itself.
fn last_requests(op: &Operator, from: usize) -> String {
    let requests = op.server.requests();
    let skip = requests.len().saturating_sub(15).max(from);
    requests
        .iter()
        .skip(skip)
        .map(|r| {
            format!(
                "  {} {}?{} [{}] -> {}\n",
                r.method,
                r.path,
                r.query,
                r.content_type.as_deref().unwrap_or_default(),
                r.status
            )
        })
        .collect()
}

/// The phase, reason and message of a release, for a report.
fn describe(sr: Option<&SequencedRelease>) -> String {
    let Some(sr) = sr else {
        return "the release is gone".into();
    };
    let phase = sr.status.as_ref().and_then(|s| s.phase);
    let ready = condition(sr, "Ready").unwrap_or_default();
    format!(
        "phase {phase:?}, revision {:?}, Ready {} {}: {}",
        sr.status.as_ref().and_then(|s| s.revision),
        ready.0,
        ready.1,
        support::charts::message(sr)
    )
}

/// Waits until the release satisfies `done` (None: until it is gone); what it last looked like
/// when it never did.
async fn wait(
    op: &Operator,
    name: &str,
    done: Option<&dyn Fn(&SequencedRelease) -> bool>,
) -> Result<(), String> {
    let api = op.releases(NAMESPACE);
    let deadline = Instant::now() + OPERATION_DEADLINE;
    loop {
        let current = api.get_opt(name).await.map_err(|e| e.to_string())?;
        match (&current, done) {
            (None, None) => return Ok(()),
            (Some(sr), Some(done)) if done(sr) => return Ok(()),
            _ => {}
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not done after {OPERATION_DEADLINE:?}: {}",
                describe(current.as_ref())
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn revision(sr: &SequencedRelease) -> Option<i64> {
    sr.status.as_ref().and_then(|s| s.revision)
}

/// sequenced runs `operations` on the same chart, release name, namespace and values, with
/// every layer at once. An operation that does not end as it should is reported and ends the
/// scenario's sequenced side (what would follow is meaningless).
async fn sequenced_side(
    pattern: &str,
    name: &str,
    operations: &[Operation],
    scope: &Watched,
) -> Vec<Observed> {
    let (op, _jobs, _deployments) = cluster(true).await;
    let api = op.releases(NAMESPACE);
    let home = TempDir::new().expect("helm home");
    let mut seen = Vec::new();
    for (n, operation) in operations.iter().enumerate() {
        let from = op.server.requests().len();
        let outcome = match operation {
            Operation::Install | Operation::FailedInstall => {
                let spec = json!({"sequencing": "none", "timeout": OPERATION_TIMEOUT});
                op.create(NAMESPACE, release(name, &chart_dir(pattern), spec))
                    .await;
                if *operation == Operation::Install {
                    wait(
                        &op,
                        name,
                        Some(&|sr| is_ready(sr) && revision(sr) == Some(1)),
                    )
                    .await
                } else {
                    wait(
                        &op,
                        name,
                        Some(&|sr| {
                            sr.status.as_ref().and_then(|s| s.phase) == Some(ReleasePhase::Failed)
                                && condition(sr, "Ready").is_some_and(|c| c.1 == "HookFailed")
                        }),
                    )
                    .await
                }
            }
            Operation::Upgrade => {
                let patch = json!({"spec": {"values": {"level": 2}}});
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .expect("change the values");
                wait(
                    &op,
                    name,
                    Some(&|sr| is_ready(sr) && revision(sr) == Some(2)),
                )
                .await
            }
            Operation::Rollback => {
                // What `sequenced rollback NAME 1` asks (src/cli/request.rs `patch`).
                let patch = json!({"metadata": {"annotations": {
                    ROLLBACK_REQUEST_ANNOTATION: "oracle-rollback",
                    ROLLBACK_REVISION_ANNOTATION: "1",
                }}});
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .expect("request the rollback");
                wait(
                    &op,
                    name,
                    Some(&|sr| is_ready(sr) && revision(sr) == Some(3)),
                )
                .await
            }
            Operation::Uninstall => {
                api.delete(name, &DeleteParams::default())
                    .await
                    .expect("delete the release");
                wait(&op, name, None).await
            }
            Operation::Test | Operation::FailedTest => {
                // What `sequenced test NAME` asks (src/cli/request.rs `patch`).
                let passes = if *operation == Operation::Test {
                    "True"
                } else {
                    "False"
                };
                let token = format!("oracle-test-{n}");
                let patch = json!({"metadata": {"annotations": {TEST_REQUEST_ANNOTATION: token}}});
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .expect("request the tests");
                wait(
                    &op,
                    name,
                    Some(&|sr| {
                        sr.status.as_ref().is_some_and(|s| {
                            s.last_handled_test_at.as_deref() == Some(token.as_str())
                                && s.phase == Some(ReleasePhase::Ready)
                        }) && condition(sr, "TestSuccess").is_some_and(|c| c.0 == passes)
                    }),
                )
                .await
            }
        };
        tokio::time::sleep(SETTLE).await;
        let stuck = outcome.is_err();
        seen.push(Observed {
            hook_writes: hook_writes(&op, from, scope),
            objects: objects(&op, scope).await,
            trouble: outcome.err(),
            requests: hook_requests(&op, from, scope),
            test_suites: test_suites(home.path(), &op.server.url(), name, *operation).await,
        });
        if stuck {
            break;
        }
    }
    seen
}

/// `left` and `right` as two columns, headed helm and sequenced, a `!` between the lines that
/// differ.
fn side_by_side(left: &[String], right: &[String]) -> String {
    let width = left
        .iter()
        .map(String::len)
        .chain(std::iter::once(4))
        .max()
        .unwrap_or(4);
    let mut out = format!("    {:width$}   sequenced\n", "helm");
    for i in 0..left.len().max(right.len()) {
        let l = left.get(i).map_or("", String::as_str);
        let r = right.get(i).map_or("", String::as_str);
        let mark = if l == r { ' ' } else { '!' };
        out.push_str(&format!("    {l:width$} {mark} {r}\n"));
    }
    out
}

/// Two sets as columns aligned on their union: what only one side has shows on its side only.
fn sets_side_by_side(left: &BTreeSet<String>, right: &BTreeSet<String>) -> String {
    let all: BTreeSet<&String> = left.union(right).collect();
    let column = |set: &BTreeSet<String>| -> Vec<String> {
        all.iter()
            .map(|o| {
                if set.contains(*o) {
                    o.to_string()
                } else {
                    String::new()
                }
            })
            .collect()
    };
    side_by_side(&column(left), &column(right))
}

/// Runs `operations` on pattern `pattern` with both tools and fails, naming every difference,
/// when they did not do the same.
async fn compare(pattern: &str, name: &str, operations: &[Operation]) {
    let scope = scope(pattern, name);
    let (oracle, ours) = tokio::join!(
        helm_side(pattern, name, operations, &scope),
        sequenced_side(pattern, name, operations, &scope),
    );
    let mut report = String::new();
    let mut differs = false;
    for (i, operation) in operations.iter().enumerate() {
        let helm = &oracle[i];
        let Some(seq) = ours.get(i) else {
            report.push_str(&format!(
                "## {}: not run by sequenced (an earlier operation did not end)\n",
                operation.name()
            ));
            differs = true;
            continue;
        };
        let same_writes = helm.hook_writes == seq.hook_writes;
        let same_objects = helm.objects == seq.objects;
        let same_suites = helm.test_suites == seq.test_suites;
        let ok = same_writes && same_objects && same_suites && seq.trouble.is_none();
        differs |= !ok;
        report.push_str(&format!(
            "## {}: {}\n",
            operation.name(),
            if ok { "same" } else { "DIFFERENT" }
        ));
        if let Some(trouble) = &seq.trouble {
            report.push_str(&format!("  sequenced did not end as helm did: {trouble}\n"));
        }
        report.push_str(&format!(
            "  hook creates and deletes{}:\n{}",
            if same_writes { "" } else { " (DIFFERENT)" },
            side_by_side(&helm.hook_writes, &seq.hook_writes)
        ));
        if same_objects {
            report.push_str(&format!(
                "  objects left: the same {}\n",
                helm.objects.len()
            ));
        } else {
            report.push_str(&format!(
                "  objects left (DIFFERENT):\n{}",
                sets_side_by_side(&helm.objects, &seq.objects)
            ));
        }
        if !helm.test_suites.is_empty() || !same_suites {
            report.push_str(&format!(
                "  helm status, the test run{}:\n{}",
                if same_suites { "" } else { " (DIFFERENT)" },
                side_by_side(&helm.test_suites, &seq.test_suites)
            ));
        }
        if std::env::var_os("SEQUENCED_ORACLE_TRACE").is_some() {
            report.push_str(&format!(
                "  every write to a hook object, as sent and answered:\n{}",
                side_by_side(&helm.requests, &seq.requests)
            ));
        }
    }
    eprintln!("pattern {pattern}, release {name}:\n{report}");
    assert!(
        !differs,
        "sequenced did not do what helm did with pattern {pattern}:\n{report}"
    );
}

/// ServiceAccount, ClusterRole, ClusterRoleBinding, Role, RoleBinding and a certificate Job
/// before install and upgrade, the same RBAC and a patch Job after them, all
/// `before-hook-creation,hook-succeeded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_certs() {
    within(compare("webhook-certs", "web", LIFECYCLE)).await;
}

/// A CRD-installing Job with its ServiceAccount, ClusterRole and ClusterRoleBinding at rising
/// weights, pre-install only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_install_job() {
    within(compare("crd-install-job", "ops", LIFECYCLE)).await;
}

/// A post-install check Job after its ServiceAccount, Role and RoleBinding; the Job stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_check() {
    within(compare("startup-check", "api", LIFECYCLE)).await;
}

/// ConfigMap a-settings, ServiceAccount b-runner and Job c-job, all at weight 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_weights() {
    within(compare("equal-weights", "eq", LIFECYCLE)).await;
}

/// A failing pre-install Job (hook-failed) after a ServiceAccount and a Role
/// (hook-succeeded): helm's install fails, sequenced's release ends Failed with HookFailed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_hook() {
    within(compare(
        "failing-hook",
        "broken",
        &[Operation::FailedInstall],
    ))
    .await;
}

/// A CRD as a pre-install,pre-upgrade hook with before-hook-creation,hook-succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_hook() {
    within(compare("crd-hook", "widgets", LIFECYCLE)).await;
}

/// `helm test` hooks: no operation but `helm test` (`sequenced test`) creates them; each run
/// one at a time, by weight then name, the Pod left by a run deleted before the next creates it
/// (`before-hook-creation`), the Job deleted once both passed (`hook-succeeded`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_hooks() {
    within(compare(
        "test-hooks",
        "tested",
        &[
            Operation::Install,
            Operation::Test,
            Operation::Upgrade,
            Operation::Test,
            Operation::Rollback,
            Operation::Uninstall,
        ],
    ))
    .await;
}

/// `helm test` whose second test fails (`hook-failed`) after a ConfigMap and a Pod that passed
/// (`hook-succeeded`), and a test after it that never runs; twice, the second run after an
/// upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_test() {
    within(compare(
        "failing-test",
        "checked",
        &[
            Operation::Install,
            Operation::FailedTest,
            Operation::Upgrade,
            Operation::FailedTest,
            Operation::Uninstall,
        ],
    ))
    .await;
}

/// Backup hooks before upgrade, rollback and delete, a verify Job after upgrade and rollback,
/// a cleanup Job after delete: the rollback and delete events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn db_backup() {
    within(compare("db-backup", "db", LIFECYCLE)).await;
}

/// Chart files that carry their own `# Source:` comments (CRD files that start with an https
/// URL, a relative path or another chart's `helm template` line, templates and a hook that
/// start with one, a block scalar that holds one): installed, upgraded, rolled back and
/// uninstalled as helm does, every CRD created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_sources() {
    within(compare("own-sources", "r", LIFECYCLE)).await;
}
