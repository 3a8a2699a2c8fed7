//! How Argo CD and Flux read a SequencedRelease, on the statuses the operator really writes.
//!
//! - The statuses of every phase (installing, waiting for dependencies, Ready, Failed with a
//!   retry scheduled, Failed and Stalled, rolling back, rolled back by `onFailure`, an invalid
//!   spec, suspended, uninstalling, a new generation not yet observed) are made by the controller
//!   on the test API server and compared with the Argo CD health check's testdata
//!   (`integrations/argocd/.../testdata/*.yaml`), so the testdata cannot drift from what the
//!   operator writes. `SEQUENCED_BLESS=1` writes them again.
//! - The health check (`health.lua`) runs on each of them in a Lua 5.1 interpreter with the
//!   libraries an `argocd-cm` health check gets (base and table), as Argo CD's gopher-lua runs
//!   it, and gives what `health_test.yaml` says.
//! - kstatus' published rules (`sigs.k8s.io/cli-utils/pkg/kstatus/status`: a generic resource
//!   is Terminating while deleted, InProgress while its generation is not observed or it is
//!   `Reconciling`, Failed when `Stalled`, else Current), which a Flux Kustomization's `wait`
//!   and `healthChecks` apply, and `kubectl wait --for=condition=Ready`'s check (the condition
//!   True at the object's generation) are computed on each and compared with what we mean.

use sequenced_testkit as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use sequenced::api::v1alpha1::{LayerPhase, ReleasePhase, SequencedRelease};
use serde_json::{Value, json};
use support::charts::{chart, config_map, deployment, is_ready, release, repo};
use support::operator::Operator;
use support::tenants::admin_apply;
use tempfile::TempDir;

/// Where the Argo CD health check lives, in Argo CD's own layout.
const ARGOCD: &str = "integrations/argocd/resource_customizations/sequenced.dev/SequencedRelease";

fn argocd() -> PathBuf {
    repo().join(ARGOCD)
}

/// A Job in layer `extra` (after `app`) that the played Job controller fails.
fn failing_job() -> String {
    "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: check\n  labels:\n    sequenced.test/outcome: fail\n  annotations:\n    helm.sh/layer: extra\n    helm.sh/depends-on/layers: app\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: main\n          image: busybox:1.36\n".to_string()
}

/// Chart `app`: layer `config` (ConfigMap `settings`), then layer `app` (Deployment `app`, its
/// image tag from `.Values.tag`); with `.Values.broken`, layer `extra` with a Job that fails.
fn app_chart() -> TempDir {
    let app = deployment(
        "app",
        "helm.sh/layer: app\n    helm.sh/depends-on/layers: config",
    )
    .replace("pause:3.10", "pause:{{ .Values.tag }}");
    chart(
        "app",
        &[
            (
                "templates/settings.yaml",
                &config_map("settings", "helm.sh/layer: config"),
            ),
            ("templates/app.yaml", &app),
            (
                "templates/broken.yaml",
                &format!(
                    "{{{{- if .Values.broken }}}}\n{}{{{{- end }}}}\n",
                    failing_job()
                ),
            ),
            ("values.yaml", "tag: \"3.10\"\nbroken: false\n"),
        ],
    )
}

fn phase(sr: &SequencedRelease) -> Option<ReleasePhase> {
    sr.status.as_ref().and_then(|s| s.phase)
}

fn message_of(sr: &SequencedRelease) -> String {
    sr.status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default()
}

fn layer(sr: &SequencedRelease, name: &str) -> Option<LayerPhase> {
    sr.status
        .as_ref()?
        .layers
        .iter()
        .find(|l| l.name == name)
        .map(|l| l.phase)
}

/// The release as the API server holds it, as a user's `kubectl get -o yaml` shows it, with
/// what changes from run to run made fixed: times, ids, digests, the chart's temporary path,
/// the lock's session.
async fn captured(op: &Operator, namespace: &str, name: &str) -> Value {
    let sr = op.releases(namespace).get(name).await.expect("the release");
    let mut object = serde_json::to_value(&sr).unwrap();
    normalize(&mut object, "");
    object
}

const TIME: &str = "2026-01-01T00:00:00Z";

fn normalize(value: &mut Value, key: &str) {
    match value {
        Value::Object(map) => {
            for field in [
                "managedFields",
                "uid",
                "resourceVersion",
                "creationTimestamp",
            ] {
                map.remove(field);
            }
            for (k, v) in map.iter_mut() {
                normalize(v, k);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| normalize(v, key)),
        Value::String(text) => match key {
            "lastTransitionTime" | "startedAt" | "finishedAt" | "lockedUntil" | "time"
            | "deletionTimestamp" => *text = TIME.to_string(),
            "sessionId" => *text = "session".to_string(),
            "lastAppliedDigest" | "digest" => *text = "v2:sha256:digest".to_string(),
            "path" if text.starts_with('/') => {
                let chart = Path::new(text.as_str())
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                *text = format!("/charts/{chart}");
            }
            _ => {}
        },
        _ => {}
    }
}

/// Makes the release of every phase with the controller, and returns each as captured, by the
/// name of its testdata file.
async fn every_phase() -> BTreeMap<&'static str, Value> {
    let mut op = Operator::start(8).await;
    let _jobs = op.job_controller(Duration::from_millis(50));
    let dir = app_chart();
    let path = dir.path().join("app");
    let mut captures = BTreeMap::new();
    for ns in [
        "deploying",
        "waiting",
        "healthy",
        "suspended",
        "failing",
        "rollback",
        "invalid",
        "uninstalling",
    ] {
        op.namespace(ns).await;
    }

    // Installing: layer app waits for its Deployment.
    op.create("deploying", release("app", &path, json!({})))
        .await;
    op.wait_release("deploying", "app", "layer app waiting", |sr| {
        message_of(sr).contains("waiting for Deployment app")
    })
    .await;
    captures.insert(
        "progressing-installing.yaml",
        captured(&op, "deploying", "app").await,
    );

    // Waiting for its dependencies: a Deployment that is not ready.
    let mut db: Value = serde_yaml_ng::from_str(&deployment("db", "a.b/c: d")).unwrap();
    db["metadata"]["namespace"] = json!("waiting");
    admin_apply(&op, db).await;
    op.create(
        "waiting",
        release(
            "app",
            &path,
            json!({"dependsOn": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "db"}]}),
        ),
    )
    .await;
    op.wait_release("waiting", "app", "Pending", |sr| {
        phase(sr) == Some(ReleasePhase::Pending) && message_of(sr).contains("Deployment waiting/db")
    })
    .await;
    captures.insert(
        "progressing-dependencies.yaml",
        captured(&op, "waiting", "app").await,
    );

    // Ready, and a Ready release suspended.
    for ns in ["healthy", "suspended"] {
        op.create(ns, release("app", &path, json!({}))).await;
        op.wait_object("apps/v1", "Deployment", ns, "app").await;
        assert!(op.deployment_ready(ns, "app"));
        op.wait_release(ns, "app", "Ready", is_ready).await;
    }
    captures.insert("healthy.yaml", captured(&op, "healthy", "app").await);
    op.releases("suspended")
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"suspend": true}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    captures.insert("suspended.yaml", captured(&op, "suspended", "app").await);

    // Failed with a retry scheduled, then Stalled once the retries are spent.
    op.create(
        "failing",
        release(
            "app",
            &path,
            json!({"values": {"broken": true}, "retries": 1}),
        ),
    )
    .await;
    op.wait_object("apps/v1", "Deployment", "failing", "app")
        .await;
    assert!(op.deployment_ready("failing", "app"));
    op.wait_release("failing", "app", "Failed, retry scheduled", |sr| {
        phase(sr) == Some(ReleasePhase::Failed)
            && sr.status.as_ref().and_then(|s| s.failures) == Some(1)
    })
    .await;
    captures.insert(
        "degraded-retrying.yaml",
        captured(&op, "failing", "app").await,
    );
    op.wait_release("failing", "app", "Stalled", support::charts::is_stalled)
        .await;
    captures.insert(
        "degraded-failed.yaml",
        captured(&op, "failing", "app").await,
    );

    // A failed upgrade rolled back by onFailure: rolling back, then rolled back.
    op.create(
        "rollback",
        release("app", &path, json!({"onFailure": "rollback"})),
    )
    .await;
    op.wait_object("apps/v1", "Deployment", "rollback", "app")
        .await;
    assert!(op.deployment_ready("rollback", "app"));
    op.wait_release("rollback", "app", "Ready", is_ready).await;
    op.releases("rollback")
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"values": {"broken": true, "tag": "3.9"}}})),
        )
        .await
        .unwrap();
    op.wait_release("rollback", "app", "revision 2 waiting for app", |sr| {
        sr.status.as_ref().and_then(|s| s.revision) == Some(2)
            && layer(sr, "app") == Some(LayerPhase::Waiting)
    })
    .await;
    assert!(op.deployment_ready("rollback", "app"));
    op.wait_release("rollback", "app", "rolling back, waiting for app", |sr| {
        phase(sr) == Some(ReleasePhase::RollingBack)
            && message_of(sr).contains("waiting for Deployment app")
    })
    .await;
    captures.insert(
        "progressing-rolling-back.yaml",
        captured(&op, "rollback", "app").await,
    );
    assert!(op.deployment_ready("rollback", "app"));
    op.wait_release("rollback", "app", "rolled back", |sr| {
        phase(sr) == Some(ReleasePhase::Ready)
            && sr.status.as_ref().and_then(|s| s.revision) == Some(3)
    })
    .await;
    captures.insert(
        "degraded-rolled-back.yaml",
        captured(&op, "rollback", "app").await,
    );
    // A drift correction of the rolled-back revision leaves the spec held back: still Stalled.
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(op.client.clone(), "rollback");
    config_maps
        .delete("settings", &DeleteParams::default())
        .await
        .unwrap();
    let sr = op
        .wait_release("rollback", "app", "drift corrected", |sr| {
            sr.status.as_ref().is_some_and(|s| {
                s.last_drift_correction.is_some() && s.phase == Some(ReleasePhase::Ready)
            })
        })
        .await;
    let stalled = support::charts::condition(&sr, "Stalled").unwrap();
    assert_eq!(
        (stalled.0.as_str(), stalled.1.as_str()),
        ("True", "RolledBack"),
        "{}",
        stalled.2
    );
    assert!(
        stalled.2.contains("spec generation 2 not applied"),
        "{}",
        stalled.2
    );
    assert_eq!(support::charts::condition(&sr, "Ready").unwrap().0, "False");

    // A spec the operator cannot use.
    op.create(
        "invalid",
        release("app", Path::new("/charts/missing"), json!({})),
    )
    .await;
    op.wait_release("invalid", "app", "Stalled", support::charts::is_stalled)
        .await;
    captures.insert(
        "degraded-invalid-spec.yaml",
        captured(&op, "invalid", "app").await,
    );

    // Uninstalling: held by a finalizer on one of its objects.
    op.create("uninstalling", release("app", &path, json!({})))
        .await;
    op.wait_object("apps/v1", "Deployment", "uninstalling", "app")
        .await;
    assert!(op.deployment_ready("uninstalling", "app"));
    op.wait_release("uninstalling", "app", "Ready", is_ready)
        .await;
    let held = json!({"metadata": {"finalizers": ["example.com/hold"]}});
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(op.client.clone(), "uninstalling");
    config_maps
        .patch("settings", &PatchParams::default(), &Patch::Merge(&held))
        .await
        .unwrap();
    op.releases("uninstalling")
        .delete("app", &DeleteParams::default())
        .await
        .unwrap();
    op.wait_release("uninstalling", "app", "uninstalling, held", |sr| {
        phase(sr) == Some(ReleasePhase::Uninstalling) && message_of(sr).contains("example.com/hold")
    })
    .await;
    captures.insert(
        "progressing-uninstalling.yaml",
        captured(&op, "uninstalling", "app").await,
    );

    // A new generation the operator has not acted on yet (it is stopped).
    op.take_controller().stop().await;
    op.releases("healthy")
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"values": {"tag": "3.9"}}})),
        )
        .await
        .unwrap();
    captures.insert(
        "progressing-new-generation.yaml",
        captured(&op, "healthy", "app").await,
    );
    op.stop().await;
    captures
}

fn read_yaml(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The testdata files, by name.
fn testdata() -> BTreeMap<String, Value> {
    let dir = argocd().join("testdata");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("the testdata directory") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            files.insert(name, read_yaml(&path));
        }
    }
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_testdata_is_what_the_operator_writes_in_every_phase() {
    let captures = tokio::time::timeout(Duration::from_secs(240), every_phase())
        .await
        .expect("the phases were not all reached in time");
    let dir = argocd().join("testdata");
    if std::env::var_os("SEQUENCED_BLESS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, object) in &captures {
            let text = serde_yaml_ng::to_string(object).unwrap();
            std::fs::write(dir.join(name), text).unwrap();
        }
    }
    let stored = testdata();
    let mut stale = Vec::new();
    for (name, object) in &captures {
        match stored.get(*name) {
            Some(kept) if kept == object => {}
            Some(kept) => stale.push(format!(
                "{name} differs from what the operator writes now:\n--- testdata\n{}\n--- written\n{}",
                serde_yaml_ng::to_string(kept).unwrap(),
                serde_yaml_ng::to_string(object).unwrap()
            )),
            None => stale.push(format!("{name} is missing")),
        }
    }
    for name in stored.keys() {
        if !captures.contains_key(name.as_str()) {
            stale.push(format!("{name} is not made by any scenario here"));
        }
    }
    assert!(
        stale.is_empty(),
        "the Argo CD testdata is stale (SEQUENCED_BLESS=1 cargo nextest run --test gitops writes it again, then check health_test.yaml):\n{}",
        stale.join("\n\n")
    );
}

/// Argo CD's `obj`, made from JSON as its `decodeValue` makes it.
fn to_lua(lua: &mlua::Lua, value: &Value) -> mlua::Result<mlua::Value> {
    Ok(match value {
        Value::Null => mlua::Value::Nil,
        Value::Bool(b) => mlua::Value::Boolean(*b),
        Value::Number(n) => mlua::Value::Number(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => mlua::Value::String(lua.create_string(s)?),
        Value::Array(items) => {
            let table = lua.create_table()?;
            for item in items {
                table.raw_push(to_lua(lua, item)?)?;
            }
            mlua::Value::Table(table)
        }
        Value::Object(map) => {
            let table = lua.create_table()?;
            for (k, v) in map {
                table.raw_set(k.as_str(), to_lua(lua, v)?)?;
            }
            mlua::Value::Table(table)
        }
    })
}

/// Runs `health.lua` on `object` as Argo CD runs a health check from `argocd-cm`: a fresh Lua
/// 5.1 state with the base and table libraries only, `obj` set, the script's returned table
/// read as `{status, message}`.
fn health(script: &str, object: &Value) -> (String, String) {
    let lua = mlua::Lua::new_with(mlua::StdLib::TABLE, mlua::LuaOptions::default())
        .expect("a Lua 5.1 state");
    for absent in ["string", "os", "io", "debug", "package"] {
        let found: mlua::Value = lua.globals().get(absent).unwrap();
        assert!(found.is_nil(), "library {absent} is open");
    }
    lua.globals()
        .set("obj", to_lua(&lua, object).unwrap())
        .unwrap();
    let result: mlua::Table = lua
        .load(script)
        .set_name("health.lua")
        .eval()
        .unwrap_or_else(|e| panic!("health.lua failed: {e}"));
    let status: String = result.get("status").expect("status");
    let message: String = result.get("message").unwrap_or_default();
    (status, message)
}

#[test]
fn the_argocd_health_check_gives_what_its_tests_say_on_every_phase() {
    let dir = argocd();
    let script = std::fs::read_to_string(dir.join("health.lua")).expect("health.lua");
    let tests = read_yaml(&dir.join("health_test.yaml"));
    let cases = tests["tests"].as_array().expect("tests: [...]");
    let mut covered = Vec::new();
    let mut failures = Vec::new();
    for case in cases {
        let input = case["inputPath"].as_str().expect("inputPath");
        let want = (
            case["healthStatus"]["status"].as_str().unwrap().to_string(),
            case["healthStatus"]["message"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
        let got = health(&script, &read_yaml(&dir.join(input)));
        if got != want {
            failures.push(format!(
                "{input}: got {got:?}, health_test.yaml says {want:?}"
            ));
        }
        covered.push(input.trim_start_matches("testdata/").to_string());
    }
    // Every phase's status has its case.
    for name in testdata().keys() {
        if !covered.contains(name) {
            failures.push(format!("testdata/{name} has no case in health_test.yaml"));
        }
    }
    // The file name says the health it must get.
    for case in cases {
        let input = case["inputPath"].as_str().unwrap();
        let status = case["healthStatus"]["status"]
            .as_str()
            .unwrap()
            .to_lowercase();
        let name = input.trim_start_matches("testdata/");
        if !name.starts_with(&status) {
            failures.push(format!("{input} is named for another health than {status}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_argocd_health_check_reads_what_an_older_or_bare_object_has() {
    let script = std::fs::read_to_string(argocd().join("health.lua")).expect("health.lua");
    // Just created: no status yet.
    let bare = json!({"apiVersion": "sequenced.dev/v1alpha1", "kind": "SequencedRelease",
        "metadata": {"name": "app", "namespace": "apps", "generation": 1},
        "spec": {"chart": {"path": "/charts/app"}}});
    assert_eq!(health(&script, &bare).0, "Progressing");
    // Suspended before the operator ever wrote a status.
    let mut suspended = bare.clone();
    suspended["spec"]["suspend"] = json!(true);
    assert_eq!(health(&script, &suspended).0, "Suspended");
    // Being deleted wins over everything else.
    let mut deleted = suspended.clone();
    deleted["metadata"]["deletionTimestamp"] = json!(TIME);
    assert_eq!(health(&script, &deleted).0, "Progressing");
}

/// kstatus' result for a resource of a kind without rules of its own (a custom resource), as
/// `status.Compute` of `sigs.k8s.io/cli-utils/pkg/kstatus/status` publishes it.
fn kstatus(object: &Value) -> &'static str {
    if object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| t.as_str().is_some_and(|t| !t.is_empty()))
    {
        return "Terminating";
    }
    let generation = object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    let observed = object
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    if let (Some(generation), Some(observed)) = (generation, observed)
        && observed != generation
    {
        return "InProgress";
    }
    let conditions = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for condition in &conditions {
        let is = |type_: &str| condition["type"] == type_ && condition["status"] == "True";
        if is("Reconciling") {
            return "InProgress";
        }
        if is("Stalled") {
            return "Failed";
        }
    }
    "Current"
}

/// Whether `kubectl wait --for=condition=Ready` is satisfied: the condition is True, and not
/// for an older generation (its `observedGeneration`, else the status's).
fn kubectl_wait_ready(object: &Value) -> bool {
    let generation = object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    let conditions = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let Some(ready) = conditions.iter().find(|c| {
        c["type"]
            .as_str()
            .is_some_and(|t| t.eq_ignore_ascii_case("Ready"))
    }) else {
        return false;
    };
    let observed = ready["observedGeneration"].as_i64().or_else(|| {
        object
            .pointer("/status/observedGeneration")
            .and_then(Value::as_i64)
    });
    if let (Some(generation), Some(observed)) = (generation, observed)
        && observed < generation
    {
        return false;
    }
    ready["status"]
        .as_str()
        .is_some_and(|s| s.eq_ignore_ascii_case("True"))
}

#[test]
fn kstatus_and_kubectl_wait_read_every_phase_as_we_mean_it() {
    // (testdata, what kstatus says, whether `kubectl wait --for=condition=Ready` is satisfied,
    // why that is what it should be)
    let table = [
        (
            "progressing-installing.yaml",
            "InProgress",
            false,
            "a revision is under way",
        ),
        (
            "progressing-dependencies.yaml",
            "InProgress",
            false,
            "waiting for dependsOn is progress, not a failure",
        ),
        (
            "healthy.yaml",
            "Current",
            true,
            "every object of the revision is ready",
        ),
        (
            "degraded-retrying.yaml",
            "InProgress",
            false,
            "Failed, but a retry is scheduled (Reconciling): a Kustomization keeps waiting",
        ),
        (
            "degraded-failed.yaml",
            "Failed",
            false,
            "retries spent: Stalled until the spec changes, a Kustomization fails at once",
        ),
        (
            "progressing-rolling-back.yaml",
            "InProgress",
            false,
            "onFailure is rolling back",
        ),
        (
            "degraded-rolled-back.yaml",
            "Failed",
            false,
            "the spec's revision failed and is held back: Stalled (RolledBack)",
        ),
        (
            "degraded-invalid-spec.yaml",
            "Failed",
            false,
            "an unusable spec: Stalled",
        ),
        (
            "suspended.yaml",
            "InProgress",
            false,
            "suspending is a change the operator does not act on: the generation is not observed",
        ),
        (
            "progressing-uninstalling.yaml",
            "Terminating",
            false,
            "being deleted",
        ),
        (
            "progressing-new-generation.yaml",
            "InProgress",
            false,
            "a status of the previous generation says nothing of this one",
        ),
    ];
    let files = testdata();
    let mut failures = Vec::new();
    for (name, want_kstatus, want_ready, why) in table {
        let object = files
            .get(name)
            .unwrap_or_else(|| panic!("testdata/{name} is missing"));
        let got = (kstatus(object), kubectl_wait_ready(object));
        if got != (want_kstatus, want_ready) {
            failures.push(format!(
                "{name}: kstatus {}, kubectl wait Ready {}; we mean {want_kstatus}, {want_ready} ({why})",
                got.0, got.1
            ));
        }
    }
    for name in files.keys() {
        if !table.iter().any(|(n, ..)| n == name) {
            failures.push(format!("testdata/{name} is not in the table"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The kubectl to run: `$SEQUENCED_KUBECTL`, else `.tools/bin/kubectl` of this repository
/// (`scripts/install-kubectl.sh` puts one there), else the one on PATH.
fn kubectl() -> PathBuf {
    if let Some(path) = std::env::var_os("SEQUENCED_KUBECTL") {
        return PathBuf::from(path);
    }
    let local = repo().join(".tools/bin/kubectl");
    if local.is_file() {
        return local;
    }
    PathBuf::from("kubectl")
}

/// Writes `object` (a testdata release) to the server as the operator left it: created, its
/// spec changed until it has the same generation, its status written through the status
/// subresource, and deleted (held by its finalizer) when it was being deleted.
async fn store(op: &Operator, object: &Value) {
    let namespace = object["metadata"]["namespace"].as_str().unwrap();
    let name = object["metadata"]["name"].as_str().unwrap();
    let generation = object["metadata"]["generation"].as_i64().unwrap_or(1);
    let api = op.releases(namespace);
    let mut created = object.clone();
    created["status"] = Value::Null;
    if let Some(metadata) = created["metadata"].as_object_mut() {
        metadata.remove("generation");
        metadata.remove("deletionTimestamp");
    }
    let sr: SequencedRelease = serde_json::from_value(created).unwrap();
    api.create(&PostParams::default(), &sr)
        .await
        .expect("create");
    for n in 1..generation {
        let patch = json!({"spec": {"maxHistory": 100 + n}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    let status = json!({"status": object["status"]});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("write the status");
    if object.pointer("/metadata/deletionTimestamp").is_some() {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let stored = api.get(name).await.unwrap();
    assert_eq!(
        stored.metadata.generation,
        Some(generation),
        "{name} in {namespace}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_kubectl_wait_agrees_with_the_table_on_every_phase() {
    let kubectl = kubectl();
    let version = std::process::Command::new(&kubectl)
        .args(["version", "--client"])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "kubectl ({}) does not run: {e}; scripts/install-kubectl.sh installs one, or set SEQUENCED_KUBECTL",
                kubectl.display()
            )
        });
    assert!(version.status.success(), "kubectl version --client failed");
    // No controller: the statuses stay as the operator wrote them.
    let op = Operator::without_controller().await;
    let home = TempDir::new().unwrap();
    let kubeconfig = support::kubeconfig(&home, &op.server.url(), "default");
    let mut failures = Vec::new();
    for (file, object) in testdata() {
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap()
            .to_string();
        // Two phases come from one namespace: each gets its own.
        let namespace = format!("{namespace}-{}", file.trim_end_matches(".yaml"));
        op.namespace(&namespace).await;
        let mut object = object.clone();
        object["metadata"]["namespace"] = json!(namespace);
        store(&op, &object).await;
        let out = tokio::process::Command::from(support::sequenced_command(
            kubectl.to_str().unwrap(),
            &kubeconfig,
        ))
        .args([
            "wait",
            "--for=condition=Ready",
            "--timeout=0",
            "-n",
            &namespace,
            "sequencedrelease/app",
        ])
        .output()
        .await
        .expect("run kubectl");
        let met = out.status.success();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !met && !stderr.contains("condition not met") {
            failures.push(format!("{file}: kubectl wait failed otherwise: {stderr}"));
            continue;
        }
        if met != kubectl_wait_ready(&object) {
            failures.push(format!(
                "{file}: kubectl wait says {met}, the table's reading {}",
                kubectl_wait_ready(&object)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_book_and_the_operator_chart_carry_the_health_check_as_it_is() {
    let script = std::fs::read_to_string(argocd().join("health.lua")).expect("health.lua");
    let indented = |by: &str| {
        script
            .trim_end()
            .lines()
            .map(|l| {
                if l.is_empty() {
                    String::new()
                } else {
                    format!("{by}{l}")
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    // The chart reads its copy with .Files.Get: it is the same file.
    let copy = std::fs::read_to_string(repo().join("charts/sequenced/argocd/health.lua"))
        .expect("the chart's copy");
    assert_eq!(
        copy, script,
        "charts/sequenced/argocd/health.lua is not health.lua"
    );
    // The book's argocd-cm snippet.
    let page = std::fs::read_to_string(repo().join("docs/src/operating/gitops.md")).unwrap();
    assert!(
        page.contains("  resource.customizations.health.sequenced.dev_SequencedRelease: |\n")
            && page.contains(&indented("    ")),
        "the book's argocd-cm snippet is not health.lua"
    );
    // The install notes.
    let output = std::process::Command::new(support::helm())
        .args(["install", "sequenced"])
        .arg(repo().join("charts/sequenced"))
        .args(["--namespace", "sequenced-system", "--dry-run=client"])
        .output()
        .expect("run helm");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let notes = stdout.split_once("NOTES:").expect("notes").1;
    assert!(
        notes.contains("    resource.customizations.health.sequenced.dev_SequencedRelease: |\n")
    );
    // helm's indent keeps the blank lines' indentation; the lines are the script's.
    let lines: Vec<&str> = notes.lines().map(str::trim_end).collect();
    let want: Vec<String> = script
        .trim_end()
        .lines()
        .map(|l| {
            if l.is_empty() {
                String::new()
            } else {
                format!("      {l}")
            }
        })
        .collect();
    assert!(
        lines
            .windows(want.len())
            .any(|w| w.iter().zip(&want).all(|(a, b)| a == b)),
        "the notes do not carry health.lua:\n{notes}"
    );
}
