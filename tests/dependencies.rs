//! `dependsOn` on any object and readiness in CEL, through the controller on the test API
//! server: a release waits for a Deployment, a CRD's Established condition and a custom
//! resource's `readyExpr`, and starts as soon as its watch sees the dependency ready (the
//! interval is an hour); a cycle through another release's object is refused; the account
//! must be allowed to read the object; `healthCheckExprs` and `sequenced.dev/ready-when` judge
//! custom resources Ready, InProgress and Failed; a CEL expression that does not compile is
//! refused at plan time naming the chart, the template and the object.

use sequenced_testkit as support;

use std::future::Future;
use std::time::{Duration, Instant};

use sequenced::api::ReleasePhase;
use sequenced::api::v1alpha1::SequencedRelease;
use serde_json::{Value, json};
use support::charts::{chart, condition, config_map, deployment, is_ready, is_stalled, release};
use support::operator::Operator;
use support::tenants::admin_apply;
use tempfile::TempDir;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(120), test)
        .await
        .expect("the scenario did not finish in time");
}

/// The CRD of `Database` (example.com/v1), namespaced, whose objects keep any field.
fn database_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "databases.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"kind": "Database", "plural": "databases", "singular": "database", "listKind": "DatabaseList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    })
}

/// A chart of one ConfigMap, `web`.
fn web() -> TempDir {
    chart(
        "web",
        &[("templates/web.yaml", &config_map("web", "a.b/c: d"))],
    )
}

fn status(sr: &SequencedRelease) -> sequenced::api::SequencedReleaseStatus {
    sr.status.clone().unwrap_or_default()
}

fn phase(sr: &SequencedRelease) -> Option<ReleasePhase> {
    sr.status.as_ref().and_then(|s| s.phase)
}

fn pending(sr: &SequencedRelease) -> bool {
    phase(sr) == Some(ReleasePhase::Pending)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_waits_for_a_deployment_and_starts_when_its_watch_sees_it_ready() {
    within(async {
        let op = Operator::start(4).await;
        let db = chart(
            "db",
            &[("templates/db.yaml", &deployment("db", "a.b/c: d"))],
        );
        // The Deployment is another tool's (a Helm release, an Argo CD Application).
        let object: Value = serde_yaml_ng::from_str(&deployment("db", "a.b/c: d")).unwrap();
        let mut object = object;
        object["metadata"]["namespace"] = json!("default");
        admin_apply(&op, object).await;
        let web = web();
        op.create(
            "default",
            release(
                "web",
                &web.path().join("web"),
                json!({"interval": "1h", "dependsOn": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "db"}]}),
            ),
        )
        .await;
        let sr = op.wait_release("default", "web", "Pending", pending).await;
        let waiting = status(&sr).message.clone().unwrap_or_default();
        assert!(
            waiting.starts_with("waiting for Deployment default/db: "),
            "{waiting}"
        );
        let (reconciling, reason, _) = condition(&sr, "Reconciling").unwrap();
        assert_eq!(
            (reconciling.as_str(), reason.as_str()),
            ("True", "DependencyNotReady")
        );
        // The status says what it waits for and why.
        let dependency = &status(&sr).dependencies[0].clone();
        assert_eq!(
            (
                dependency.kind.as_str(),
                dependency.api_version.as_deref(),
                dependency.namespace.as_deref(),
                dependency.name.as_str(),
                dependency.ready
            ),
            ("Deployment", Some("apps/v1"), Some("default"), "db", false)
        );
        assert!(dependency.message.is_some());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            op.server
                .object("v1", "ConfigMap", Some("default"), "web")
                .is_none(),
            "web waits for the Deployment"
        );

        let ready_at = Instant::now();
        assert!(op.deployment_ready("default", "db"));
        let sr = op.wait_release("default", "web", "Ready", is_ready).await;
        assert!(op.first_apply("ConfigMap", "default", "web").unwrap() > ready_at);
        assert!(
            status(&sr).dependencies.is_empty(),
            "told only while waiting"
        );
        drop(db);
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_waits_for_a_crd_to_be_established_and_a_custom_resource_by_its_ready_expr() {
    within(async {
        let op = Operator::start(4).await;
        let web = web();
        op.create(
            "default",
            release(
                "web",
                &web.path().join("web"),
                json!({"interval": "1h", "dependsOn": [
                    {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                     "name": "databases.example.com"},
                    {"apiVersion": "example.com/v1", "kind": "Database", "name": "main",
                     "readyExpr": "has(self.status) && self.status.phase == 'Running' && dep.spec.size >= 1"}]}),
            ),
        )
        .await;
        op.wait_release("default", "web", "waiting for the CRD", |sr| {
            status(sr).message.as_deref()
                == Some("waiting for CustomResourceDefinition databases.example.com, which does not exist")
        })
        .await;
        // The CRD appears, but is not established yet.
        admin_apply(&op, database_crd()).await;
        op.server.set_status(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            None,
            "databases.example.com",
            json!({"conditions": [{"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found"},
                {"type": "Established", "status": "False", "reason": "Installing", "message": "the initial names have not been accepted"}]}),
        );
        op.wait_release("default", "web", "waiting for Established", |sr| {
            status(sr).message.as_deref().is_some_and(|m| {
                m.starts_with("waiting for CustomResourceDefinition databases.example.com: ")
                    && m.contains("not established yet")
            })
        })
        .await;
        op.server.set_status(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            None,
            "databases.example.com",
            json!({"conditions": [{"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found"},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"}]}),
        );
        // The kind is served now; the Database does not exist yet.
        let sr = op
            .wait_release("default", "web", "waiting for the Database", |sr| {
                status(sr).message.as_deref()
                    == Some("waiting for Database default/main, which does not exist")
            })
            .await;
        assert!(status(&sr).dependencies[0].ready);
        assert_eq!(status(&sr).dependencies[0].namespace, None, "a CRD has no namespace");
        admin_apply(
            &op,
            json!({"apiVersion": "example.com/v1", "kind": "Database",
                "metadata": {"name": "main", "namespace": "default"}, "spec": {"size": 2}}),
        )
        .await;
        op.wait_release("default", "web", "waiting for the readyExpr", |sr| {
            status(sr).message.as_deref().is_some_and(|m| {
                m.starts_with("waiting for Database default/main: readyExpr ") && m.ends_with(" is false")
            })
        })
        .await;
        op.server.set_status("example.com/v1", "Database", Some("default"), "main", json!({"phase": "Creating"}));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "web").is_none());
        let ready_at = Instant::now();
        op.server.set_status("example.com/v1", "Database", Some("default"), "main", json!({"phase": "Running"}));
        op.wait_release("default", "web", "Ready", is_ready).await;
        assert!(op.first_apply("ConfigMap", "default", "web").unwrap() > ready_at);
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_through_an_object_of_another_release_is_refused_naming_it() {
    within(async {
        let op = Operator::start(4).await;
        let db = chart("db", &[("templates/db.yaml", &deployment("db", "a.b/c: d"))]);
        op.create("default", release("db", &db.path().join("db"), json!({}))).await;
        op.wait_object("apps/v1", "Deployment", "default", "db").await;
        let web = web();
        // web waits for the Deployment release db applies.
        op.create(
            "default",
            release(
                "web",
                &web.path().join("web"),
                json!({"dependsOn": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "db"}]}),
            ),
        )
        .await;
        let sr = op.wait_release("default", "web", "Pending", pending).await;
        assert_eq!(status(&sr).dependencies[0].owner.as_deref(), Some("default/db"));
        // And db now waits for web: neither can ever start.
        op.patch_spec("db", json!({"dependsOn": [{"name": "web"}]})).await;
        let sr = op.wait_release("default", "db", "Stalled", is_stalled).await;
        let (_, reason, text) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "DependencyCycle");
        assert_eq!(
            text,
            "release dependency cycle: default/db -> default/web -> Deployment default/db of default/db"
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_account_must_be_allowed_to_read_the_object_and_other_namespaces_can_be_refused() {
    within(async {
        let op = Operator::start(4).await;
        op.namespace("team").await;
        admin_apply(&op, json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "deployer", "namespace": "team"}})).await;
        admin_apply(&op, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "deployer", "namespace": "team"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]})).await;
        admin_apply(&op, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "deployer", "namespace": "team"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployer"},
            "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": "team"}]})).await;
        let mut db: Value = serde_yaml_ng::from_str(&deployment("db", "a.b/c: d")).unwrap();
        db["metadata"]["namespace"] = json!("team");
        admin_apply(&op, db).await;
        assert!(op.deployment_ready("team", "db"));
        let web = web();
        op.create(
            "team",
            release(
                "web",
                &web.path().join("web"),
                json!({"serviceAccountName": "deployer", "interval": "2s", "dependsOn": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "db"}]}),
            ),
        )
        .await;
        let sr = op.wait_release("team", "web", "Stalled", is_stalled).await;
        let (_, reason, text) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "Forbidden");
        assert_eq!(
            text,
            "serviceaccount team:deployer cannot get deployments.apps \"db\""
        );
        // Reading alone is not enough: the release watches what it waits for.
        admin_apply(&op, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "deployer", "namespace": "team"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]}]})).await;
        op.wait_release("team", "web", "Stalled on watch", |sr| {
            condition(sr, "Stalled").is_some_and(|(_, _, text)| {
                text == "serviceaccount team:deployer cannot watch deployments.apps in namespace team"
            })
        })
        .await;
        admin_apply(&op, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "deployer", "namespace": "team"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "watch"]}]})).await;
        op.wait_release("team", "web", "Ready", is_ready).await;
        op.stop().await;

        // A controller that refuses references to other namespaces refuses a dependency there.
        let op = Operator::start_with(
            4,
            sequenced::controller::Tenancy {
                no_cross_namespace_refs: true,
                ..Default::default()
            },
        )
        .await;
        op.create(
            "default",
            release(
                "web",
                &web.path().join("web"),
                json!({"dependsOn": [{"apiVersion": "apps/v1", "kind": "Deployment",
                    "name": "db", "namespace": "team"}]}),
            ),
        )
        .await;
        let sr = op.wait_release("default", "web", "Stalled", is_stalled).await;
        let (_, reason, text) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "CrossNamespaceRef");
        assert!(text.ends_with("spec.dependsOn[0] Deployment team/db"), "{text}");
        op.stop().await;
    })
    .await;
}

/// A chart of Database `main` (its CRD in crds/) and ConfigMap `after`, in a layer after it.
fn database_chart(annotation: &str) -> TempDir {
    let crd = serde_yaml_ng::to_string(&database_crd()).unwrap();
    chart(
        "data",
        &[
            ("crds/databases.yaml", &crd),
            (
                "templates/database.yaml",
                &format!(
                    "apiVersion: example.com/v1\nkind: Database\nmetadata:\n  name: main\n  annotations:\n    helm.sh/layer: database\n    {annotation}\nspec:\n  size: 1\n"
                ),
            ),
            (
                "templates/after.yaml",
                &config_map(
                    "after",
                    "helm.sh/layer: after\n    helm.sh/depends-on/layers: database",
                ),
            ),
        ],
    )
}

fn health_check_exprs() -> Value {
    json!([{"apiVersion": "example.com/v1", "kind": "Database",
        "inProgress": "has(self.status.phase) && self.status.phase == 'Creating'",
        "failed": "has(status.phase) && status.phase == 'Error'",
        "current": "has(status.phase) && status.phase == 'Running'"}])
}

fn database_layer(sr: &SequencedRelease) -> Option<sequenced::api::LayerStatus> {
    status(sr)
        .layers
        .iter()
        .find(|l| l.name == "database")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_check_exprs_judge_a_custom_resource_ready_in_progress_and_failed() {
    within(async {
        let op = Operator::start(4).await;
        let dir = database_chart("a.b/c: d");
        op.create(
            "default",
            release(
                "data",
                &dir.path().join("data"),
                json!({"healthCheckExprs": health_check_exprs()}),
            ),
        )
        .await;
        op.wait_object("example.com/v1", "Database", "default", "main").await;
        // Without a status the expressions cannot be evaluated: in progress, saying why.
        let sr = op
            .wait_release("default", "data", "layer database waiting", |sr| {
                database_layer(sr).and_then(|l| l.message).is_some_and(|m| {
                    m.contains("Database main: waiting for healthCheckExprs: inProgress \"has(self.status.phase) && self.status.phase == 'Creating'\" (no such key: status)")
                })
            })
            .await;
        assert_eq!(phase(&sr), Some(ReleasePhase::Deploying));
        op.server.set_status("example.com/v1", "Database", Some("default"), "main", json!({"phase": "Creating"}));
        op.wait_release("default", "data", "inProgress", |sr| {
            database_layer(sr).and_then(|l| l.message).is_some_and(|m| {
                m.contains("healthCheckExprs inProgress \"has(self.status.phase) && self.status.phase == 'Creating'\" is true")
            })
        })
        .await;
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "after").is_none());
        op.server.set_status("example.com/v1", "Database", Some("default"), "main", json!({"phase": "Running"}));
        op.wait_release("default", "data", "Ready", is_ready).await;
        op.wait_object("v1", "ConfigMap", "default", "after").await;

        // The same chart in another release, whose Database fails.
        let dir = database_chart("a.b/c: d");
        op.namespace("other").await;
        op.create(
            "other",
            release(
                "data",
                &dir.path().join("data"),
                json!({"healthCheckExprs": health_check_exprs()}),
            ),
        )
        .await;
        op.wait_object("example.com/v1", "Database", "other", "main").await;
        op.server.set_status("example.com/v1", "Database", Some("other"), "main", json!({"phase": "Error"}));
        let sr = op.wait_release("other", "data", "Failed", |sr| phase(sr) == Some(ReleasePhase::Failed)).await;
        let (_, reason, text) = condition(&sr, "Ready").unwrap();
        assert_eq!(reason, "ReadinessFailed");
        assert!(
            text.contains("Database main: healthCheckExprs failed \"has(status.phase) && status.phase == 'Error'\" is true"),
            "{text}"
        );
        assert!(op.server.object("v1", "ConfigMap", Some("other"), "after").is_none());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_when_annotation_judges_its_object_and_a_bad_one_is_refused_naming_it() {
    within(async {
        let op = Operator::start(4).await;
        let dir = database_chart(
            "sequenced.dev/ready-when: \"has(self.status) && has(self.status.replicas) && self.status.replicas >= self.spec.size\"",
        );
        op.create("default", release("data", &dir.path().join("data"), json!({}))).await;
        op.wait_object("example.com/v1", "Database", "default", "main").await;
        op.wait_release("default", "data", "layer database waiting", |sr| {
            database_layer(sr).and_then(|l| l.message).is_some_and(|m| {
                m.contains("Database main: waiting for sequenced.dev/ready-when \"has(self.status) && has(self.status.replicas) && self.status.replicas >= self.spec.size\" (false)")
            })
        })
        .await;
        op.server.set_status("example.com/v1", "Database", Some("default"), "main", json!({"replicas": 1}));
        op.wait_release("default", "data", "Ready", is_ready).await;

        // An expression that does not compile: refused before anything is applied.
        let bad = database_chart("sequenced.dev/ready-when: \"self.status.replicas >=\"");
        op.namespace("bad").await;
        op.create("bad", release("data", &bad.path().join("data"), json!({}))).await;
        let sr = op.wait_release("bad", "data", "Stalled", is_stalled).await;
        let (_, reason, text) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "PlanFailed");
        assert!(
            text.contains("annotation sequenced.dev/ready-when: \"self.status.replicas >=\": "),
            "{text}"
        );
        assert!(text.contains("Database/main") && text.contains("templates/database.yaml"), "{text}");
        assert!(op.server.object("example.com/v1", "Database", Some("bad"), "main").is_none());
        op.stop().await;
    })
    .await;
}
