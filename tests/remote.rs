//! Remote clusters (`spec.kubeConfig`, issue "Reach") on two in-process test API servers: the
//! management cluster holds the SequencedRelease, its Lease, status and events and the
//! kubeconfig Secret; the remote one holds the release's objects and its Helm records. Installed
//! in order, drift corrected, upgraded, rolled back and uninstalled there; `helm history` pointed
//! at the remote cluster reads the records; a remote cluster that stops answering is a visible
//! condition and the release resumes when it is back; a kubeconfig with an exec plugin is
//! refused; in multi-tenant mode the kubeconfig Secret is read as the release's account.

use sequenced_testkit as support;

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use sequenced::api::v1alpha1::SequencedRelease;
use sequenced::api::{
    RECONCILE_REQUEST_ANNOTATION, ROLLBACK_REQUEST_ANNOTATION, ROLLBACK_REVISION_ANNOTATION,
};
use sequenced::controller::Tenancy;
use serde_json::{Value, json};
use support::apiserver::TestApiServer;
use support::charts::{chart, condition, is_ready, message, release};
use support::operator::{Operator, is_dry_run};
use support::tenants::{self, admin_apply};
use tempfile::TempDir;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(150), test)
        .await
        .expect("the scenario did not finish in time");
}

fn status(sr: &SequencedRelease) -> &sequenced::api::SequencedReleaseStatus {
    sr.status.as_ref().expect("a status")
}

/// The management cluster, its controller run as the operator chart's ServiceAccount with the
/// RBAC the chart renders (in its default, single-tenant mode).
async fn operator() -> Operator {
    tenants::operator_as_chart(&[], |_| {}).await
}

/// A kubeconfig for `server` with its credentials inline (the test API server takes a request
/// without its user header as the administrator's).
fn kubeconfig_of(server: &TestApiServer) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fleet-a\n  cluster:\n    server: {}\n\
         users:\n- name: deployer\n  user:\n    token: fleet-a-token\ncontexts:\n- name: fleet-a\n  \
         context:\n    cluster: fleet-a\n    user: deployer\ncurrent-context: fleet-a\n",
        server.url()
    )
}

/// Secret `name` in `namespace` of the management cluster holding `kubeconfig` under `key`.
async fn kubeconfig_secret(
    op: &Operator,
    namespace: &str,
    name: &str,
    key: &str,
    kubeconfig: &str,
) {
    admin_apply(
        op,
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": name, "namespace": namespace},
               "stringData": {key: kubeconfig}}),
    )
    .await;
}

/// Chart `fleet`: layer `config` (ConfigMap `settings`, `data.version` from the values), then
/// layer `app` (ConfigMap `app`, `data.widgets` whether the cluster it is rendered for serves
/// `example.com/v1` Widgets), which depends on it.
fn fleet() -> TempDir {
    chart(
        "fleet",
        &[
            (
                "templates/settings.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  annotations:\n    helm.sh/layer: config\ndata:\n  version: {{ .Values.version | quote }}\n",
            ),
            (
                "templates/app.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n  annotations:\n    helm.sh/layer: app\n    helm.sh/depends-on/layers: config\ndata:\n  widgets: {{ .Capabilities.APIVersions.Has \"example.com/v1/Widget\" | quote }}\n",
            ),
            ("values.yaml", "version: 1\n"),
        ],
    )
}

/// [`fleet`] with a pre-delete hook Job `cleanup`.
fn fleet_with_cleanup() -> TempDir {
    let dir = fleet();
    std::fs::write(
        dir.path().join("fleet/templates/cleanup.yaml"),
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: cleanup\n  annotations:\n    helm.sh/hook: pre-delete\n    helm.sh/hook-delete-policy: hook-succeeded\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: cleanup\n        image: busybox\n",
    )
    .unwrap();
    dir
}

/// Release `name` of chart `fleet` in `namespace` deployed through the kubeconfig of Secret
/// `fleet-a`, with more spec fields from `extra`.
fn remote_release(name: &str, dir: &TempDir, extra: Value) -> Value {
    let mut spec = json!({"interval": "1h", "kubeConfig": {"secretRef": {"name": "fleet-a"}}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    release(name, &dir.path().join("fleet"), spec)
}

fn revision(sr: &SequencedRelease) -> Option<i64> {
    sr.status.as_ref().and_then(|s| s.revision)
}

async fn ready_at(op: &Operator, namespace: &str, name: &str, at: i64) -> SequencedRelease {
    op.wait_release(namespace, name, &format!("revision {at} Ready"), |sr| {
        is_ready(sr) && revision(sr) == Some(at)
    })
    .await
}

/// ConfigMap `name`'s `data.version` on `server`, in `namespace`.
fn version_on(server: &TestApiServer, namespace: &str, name: &str) -> Option<String> {
    let object = server.object("v1", "ConfigMap", Some(namespace), name)?;
    object["data"]["version"].as_str().map(str::to_string)
}

/// The names of the ConfigMaps applied on `server`, in order, without repeats.
fn applied(server: &TestApiServer, from: usize) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in server.requests().iter().skip(from) {
        if r.verb == "apply"
            && r.status < 300
            && !is_dry_run(r)
            && r.kind.as_deref() == Some("ConfigMap")
            && let Some(name) = &r.name
            && !names.contains(name)
        {
            names.push(name.clone());
        }
    }
    names
}

/// The Helm release records of `server` in `namespace` (Secrets `sh.helm.release.v1.*`).
fn records_on(server: &TestApiServer, namespace: &str) -> Vec<String> {
    let mut names: Vec<String> = server
        .objects("v1", "Secret", Some(namespace))
        .iter()
        .filter_map(|s| s["metadata"]["name"].as_str().map(str::to_string))
        .filter(|n| n.starts_with("sh.helm.release.v1."))
        .collect();
    names.sort();
    names
}

/// `helm history NAME -o json` run by the real helm against `server`: (revision, status,
/// description) of every record.
async fn helm_history(server: &TestApiServer, name: &str) -> Vec<(i64, String, String)> {
    let url = server.url();
    let name = name.to_string();
    let text = tokio::task::spawn_blocking(move || {
        let dir = TempDir::new().unwrap();
        let kubeconfig = support::kubeconfig(&dir, &url, "default");
        support::run_helm(&kubeconfig, &["history", &name, "-o", "json"])
    })
    .await
    .expect("helm");
    let history: Value = serde_json::from_str(&text).unwrap();
    history
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["revision"].as_i64().unwrap(),
                h["status"].as_str().unwrap().to_string(),
                h["description"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_installed_corrected_upgraded_rolled_back_and_uninstalled_on_its_remote_cluster()
 {
    within(async {
        let op = operator().await;
        let remote = TestApiServer::start().await;
        // Only the remote cluster serves Widgets.
        tenants::apply_with(remote.client(), support::widget_crd()).await;
        let widgets: Api<DynamicObject> = Api::namespaced_with(
            remote.client(),
            "default",
            &support::api_resource("example.com/v1", "Widget", "widgets"),
        );
        while widgets.list(&Default::default()).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        kubeconfig_secret(&op, "default", "fleet-a", "value", &kubeconfig_of(&remote)).await;
        let dir = fleet();
        op.create("default", remote_release("shop", &dir, json!({})))
            .await;

        // Installed in order on the remote cluster, rendered for its APIs; nothing of it on the
        // management cluster.
        let sr = ready_at(&op, "default", "shop", 1).await;
        let app = remote
            .object("v1", "ConfigMap", Some("default"), "app")
            .unwrap();
        assert_eq!(app["data"]["widgets"], "true");
        assert_eq!(applied(&remote, 0), ["settings", "app"]);
        assert_eq!(
            version_on(&remote, "default", "settings").as_deref(),
            Some("1")
        );
        assert!(
            op.server
                .object("v1", "ConfigMap", Some("default"), "settings")
                .is_none()
        );
        assert!(
            op.server
                .object("v1", "ConfigMap", Some("default"), "app")
                .is_none()
        );
        assert_eq!(
            status(&sr).acting_as.as_deref(),
            Some(
                format!(
                    "the kubeconfig's user on the remote cluster {}",
                    remote.url()
                )
                .as_str()
            )
        );
        // Helm's storage is on the cluster that holds the objects.
        assert_eq!(
            records_on(&remote, "default"),
            ["sh.helm.release.v1.shop.v1"]
        );
        assert!(records_on(&op.server, "default").is_empty());
        // The lock and the status stay on the management cluster: no Lease, no write of a
        // SequencedRelease or an event reached the remote one.
        assert!(
            remote
                .objects("coordination.k8s.io/v1", "Lease", Some("default"))
                .is_empty()
        );
        assert!(remote.requests().iter().all(|r| {
            !matches!(
                r.kind.as_deref(),
                Some("SequencedRelease" | "Event" | "Lease")
            )
        }));
        let remote_objects: Api<ConfigMap> = Api::namespaced(remote.client(), "default");

        // Drift on the remote cluster is seen (its watches) and corrected there.
        remote_objects
            .delete("settings", &DeleteParams::default())
            .await
            .unwrap();
        let note = op.wait_event("default", "shop", "DriftCorrected").await;
        assert!(
            note.contains("ConfigMap default/settings deleted"),
            "{note}"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while version_on(&remote, "default", "settings").is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "settings never came back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ready_at(&op, "default", "shop", 1).await;

        // Upgraded there.
        let before = remote.requests().len();
        op.patch_spec("shop", json!({"values": {"version": 2}}))
            .await;
        ready_at(&op, "default", "shop", 2).await;
        assert_eq!(applied(&remote, before), ["settings", "app"]);
        assert_eq!(
            version_on(&remote, "default", "settings").as_deref(),
            Some("2")
        );

        // Rolled back there, on request.
        let patch = json!({"metadata": {"annotations": {
            ROLLBACK_REQUEST_ANNOTATION: "t1", ROLLBACK_REVISION_ANNOTATION: "1"}}});
        op.releases("default")
            .patch("shop", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        ready_at(&op, "default", "shop", 3).await;
        assert_eq!(
            version_on(&remote, "default", "settings").as_deref(),
            Some("1")
        );

        // helm, pointed at the remote cluster, reads the records.
        let history = helm_history(&remote, "shop").await;
        assert_eq!(history.len(), 3, "{history:?}");
        assert_eq!(history[0].0, 1);
        assert_eq!(history[1].1, "superseded");
        assert_eq!(
            history[2],
            (
                3,
                "deployed".to_string(),
                "Rollback to 1 complete".to_string()
            )
        );
        assert!(records_on(&op.server, "default").is_empty());

        // The kubeconfig Secret is kept while the release needs it (a namespace deleted while no
        // controller runs must not take it first), and let go once its uninstall is over.
        let finalizers = |op: &Operator| {
            op.server
                .object("v1", "Secret", Some("default"), "fleet-a")
                .and_then(|s| s["metadata"]["finalizers"].as_array().cloned())
                .unwrap_or_default()
        };
        assert_eq!(finalizers(&op), [json!("sequenced.dev/kubeconfig-in-use")]);

        // Uninstalled there: the objects and the records go, then the release.
        op.releases("default")
            .delete("shop", &DeleteParams::default())
            .await
            .unwrap();
        op.wait_deleted("default", "shop").await;
        assert_eq!(finalizers(&op), Vec::<Value>::new());
        assert!(remote_objects.get_opt("settings").await.unwrap().is_none());
        assert!(remote_objects.get_opt("app").await.unwrap().is_none());
        assert!(records_on(&remote, "default").is_empty());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_remote_cluster_is_a_visible_condition_and_the_release_resumes_when_it_is_back()
 {
    within(async {
        let op = operator().await;
        let remote = TestApiServer::start().await;
        kubeconfig_secret(&op, "default", "fleet-a", "value", &kubeconfig_of(&remote)).await;
        let dir = fleet();
        op.create("default", remote_release("shop", &dir, json!({})))
            .await;
        ready_at(&op, "default", "shop", 1).await;

        // The remote cluster stops answering, and the spec changes meanwhile.
        remote.set_down(true);
        op.patch_spec("shop", json!({"values": {"version": 2}}))
            .await;
        let sr = op
            .wait_release("default", "shop", "RemoteClusterUnreachable", |sr| {
                condition(sr, "Reconciling")
                    .is_some_and(|(s, r, _)| s == "True" && r == "RemoteClusterUnreachable")
            })
            .await;
        // Its objects are as they were: still Ready at the generation it last applied.
        assert!(condition(&sr, "Ready").is_some_and(|(s, _, _)| s == "True"));
        let (_, _, text) = condition(&sr, "Reconciling").unwrap();
        assert!(
            text.contains(&format!("the remote cluster {}", remote.url()))
                && text.contains("spec.kubeConfig: Secret default/fleet-a"),
            "{text}"
        );
        assert_eq!(revision(&sr), Some(1));
        let note = op
            .wait_event("default", "shop", "RemoteClusterUnreachable")
            .await;
        assert!(note.contains("is unreachable"), "{note}");
        assert_eq!(
            version_on(&remote, "default", "settings").as_deref(),
            Some("1")
        );

        // Back: the release goes on by itself and upgrades.
        remote.set_down(false);
        let sr = ready_at(&op, "default", "shop", 2).await;
        assert_eq!(
            version_on(&remote, "default", "settings").as_deref(),
            Some("2")
        );
        assert!(
            sr.status
                .as_ref()
                .unwrap()
                .conditions
                .iter()
                .all(|c| c.reason != "RemoteClusterUnreachable"),
            "{:?}",
            status(&sr).conditions
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_with_an_exec_plugin_is_refused_and_a_fixed_one_is_used() {
    within(async {
        let op = operator().await;
        let remote = TestApiServer::start().await;
        let dir = fleet();

        // No Secret yet: stalled, naming it.
        op.create("default", remote_release("shop", &dir, json!({})))
            .await;
        let stalled = |sr: &SequencedRelease| {
            condition(sr, "Stalled").is_some_and(|(s, r, _)| s == "True" && r == "InvalidKubeConfig")
        };
        let sr = op
            .wait_release("default", "shop", "Stalled InvalidKubeConfig", stalled)
            .await;
        assert!(message(&sr).contains("fleet-a"), "{}", message(&sr));

        // An exec plugin: refused, and never run.
        let marker = dir.path().join("ran");
        let exec = kubeconfig_of(&remote).replace(
            "    token: fleet-a-token\n",
            &format!(
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [\"-c\", \"touch {}\"]\n",
                marker.display()
            ),
        );
        kubeconfig_secret(&op, "default", "fleet-a", "value", &exec).await;
        let sr = op
            .wait_release("default", "shop", "the exec plugin refused", |sr| {
                stalled(sr) && message(sr).contains("exec credential plugin")
            })
            .await;
        assert_eq!(
            message(&sr),
            "spec.kubeConfig: Secret default/fleet-a: the kubeconfig cannot be used: its user \
             \"deployer\" runs an exec credential plugin (/bin/sh), which the operator refuses (as \
             Flux does by default): put the credentials inline (a token, or client certificate and \
             key data)"
        );
        op.wait_event("default", "shop", "Stalled").await;
        assert!(!marker.exists(), "the exec plugin ran");
        assert!(remote.requests().is_empty(), "the remote cluster was asked");

        // A kubeconfig with its credentials inline, under `value.yaml`: the change of the Secret
        // wakes the release, which installs.
        let secrets: Api<Secret> = Api::namespaced(op.client.clone(), "default");
        secrets
            .delete("fleet-a", &DeleteParams::default())
            .await
            .unwrap();
        kubeconfig_secret(&op, "default", "fleet-a", "value.yaml", &kubeconfig_of(&remote)).await;
        ready_at(&op, "default", "shop", 1).await;
        assert_eq!(applied(&remote, 0), ["settings", "app"]);
        op.stop().await;
    })
    .await;
}

/// On `server`, as its administrator: namespace `namespace`, and ServiceAccount `deployer` there
/// bound to a Role that may do everything a release does with ConfigMaps there.
async fn remote_tenant(server: &TestApiServer, namespace: &str) {
    let objects = [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "deployer", "namespace": namespace}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "deployer", "namespace": namespace},
               "rules": tenants::config_map_rules()}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "deployer", "namespace": namespace},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployer"},
               "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": namespace}]}),
    ];
    for object in objects {
        tenants::apply_with(server.client(), object).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_multi_tenant_mode_the_kubeconfig_secret_is_read_as_the_releases_account() {
    within(async {
        let dir = fleet();
        let allowed = dir.path().to_path_buf();
        let op = tenants::operator_as_chart(&["--set", "tenancy.multiTenant=true"], move |o| {
            o.tenancy = Tenancy {
                multi_tenant: true,
                allow_local_charts: vec![allowed],
                require_verified_charts: false,
                ..Tenancy::default()
            };
        })
        .await;
        // The tenant may do everything with ConfigMaps in its namespace, and nothing with
        // Secrets: the kubeconfig Secret is not its to read.
        tenants::tenant(&op, "team", tenants::config_map_rules()).await;
        let remote = TestApiServer::start().await;
        kubeconfig_secret(&op, "team", "fleet-a", "value", &kubeconfig_of(&remote)).await;
        op.create(
            "team",
            remote_release("app", &dir, json!({"serviceAccountName": "deployer"})),
        )
        .await;
        let sr = op
            .wait_release("team", "app", "Stalled Forbidden", |sr| {
                condition(sr, "Stalled").is_some_and(|(s, r, m)| {
                    s == "True"
                        && r == "Forbidden"
                        && m.contains("serviceaccount team:deployer cannot get secrets \"fleet-a\"")
                })
            })
            .await;
        assert!(!is_ready(&sr));
        assert!(remote.requests().is_empty(), "the remote cluster was asked");

        // The account may read that one Secret: the release deploys, the account impersonated
        // on the remote cluster too.
        admin_apply(
            &op,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": "kubeconfig", "namespace": "team"},
                   "rules": [{"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": ["fleet-a"], "verbs": ["get", "list", "watch"]}]}),
        )
        .await;
        admin_apply(
            &op,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": "kubeconfig", "namespace": "team"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kubeconfig"},
                   "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": "team"}]}),
        )
        .await;
        // On the remote cluster, the same account in the same namespace may write ConfigMaps.
        remote_tenant(&remote, "team").await;
        let patch = json!({"metadata": {"annotations": {RECONCILE_REQUEST_ANNOTATION: "now"}}});
        op.releases("team")
            .patch("app", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let sr = op
            .wait_release("team", "app", "Ready", is_ready)
            .await;
        assert_eq!(
            status(&sr).acting_as.as_deref(),
            Some(
                format!(
                    "serviceaccount team:deployer on the remote cluster {}",
                    remote.url()
                )
                .as_str()
            )
        );
        // Every read of the kubeconfig Secret on the management cluster was the account's.
        let reads: Vec<_> = op
            .server
            .requests()
            .into_iter()
            .filter(|r| {
                r.kind.as_deref() == Some("Secret")
                    && r.name.as_deref() == Some("fleet-a")
                    && r.verb == "get"
            })
            .collect();
        assert!(!reads.is_empty());
        assert!(
            reads
                .iter()
                .all(|r| r.user.as_deref() == Some("system:serviceaccount:team:deployer")),
            "{:?}",
            reads.iter().map(|r| &r.user).collect::<Vec<_>>()
        );
        // The objects on the remote cluster were applied as the account.
        assert!(
            remote
                .requests()
                .iter()
                .filter(|r| r.verb == "apply" && r.kind.as_deref() == Some("ConfigMap"))
                .all(|r| r.user.as_deref() == Some("system:serviceaccount:team:deployer"))
        );
        assert!(remote.object("v1", "ConfigMap", Some("team"), "app").is_some());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployed_release_given_a_kubeconfig_deploys_its_next_revision_on_the_remote_cluster() {
    within(async {
        let op = operator().await;
        let remote = TestApiServer::start().await;
        kubeconfig_secret(&op, "default", "fleet-a", "value", &kubeconfig_of(&remote)).await;
        let dir = fleet();
        let mut local = remote_release("shop", &dir, json!({}));
        local["spec"].as_object_mut().unwrap().remove("kubeConfig");
        op.create("default", local).await;
        ready_at(&op, "default", "shop", 1).await;
        assert_eq!(
            version_on(&op.server, "default", "settings").as_deref(),
            Some("1")
        );

        op.patch_spec(
            "shop",
            json!({"kubeConfig": {"secretRef": {"name": "fleet-a"}}}),
        )
        .await;
        let sr = op
            .wait_release("default", "shop", "Ready on the remote cluster", |sr| {
                is_ready(sr) && revision(sr).is_some_and(|r| r > 1)
            })
            .await;
        assert_eq!(
            version_on(&remote, "default", "settings").as_deref(),
            Some("1")
        );
        assert!(
            status(&sr)
                .acting_as
                .as_deref()
                .is_some_and(|a| a.contains("on the remote cluster")),
            "{:?}",
            status(&sr).acting_as
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_run_on_the_remote_cluster_and_their_logs_are_read_there() {
    within(async {
        let op = operator().await;
        let remote = TestApiServer::start().await;
        let _jobs = remote.job_controller(Duration::from_millis(50));
        kubeconfig_secret(&op, "default", "fleet-a", "value", &kubeconfig_of(&remote)).await;
        let failing = format!(
            "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\n  labels:\n    {}: fail\n  annotations:\n    helm.sh/hook: pre-install\nspec:\n  backoffLimit: 0\n  template:\n    metadata:\n      annotations:\n        {}: \"no table fleet\\n\"\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: main\n          image: busybox:1.36\n",
            support::workloads::OUTCOME_LABEL,
            support::workloads::LOG_ANNOTATION,
        );
        let dir = chart("hooked", &[("templates/migrate.yaml", failing.as_str())]);
        let mut spec = remote_release("app", &dir, json!({}));
        spec["spec"]["chart"]["path"] = json!(dir.path().join("hooked").display().to_string());
        op.create("default", spec).await;
        let sr = op
            .wait_release("default", "app", "Stalled HookFailed", |sr| {
                condition(sr, "Stalled").is_some_and(|(s, r, _)| s == "True" && r == "HookFailed")
            })
            .await;
        // The Job ran on the remote cluster, and its log was read there.
        assert!(remote.object("batch/v1", "Job", Some("default"), "migrate").is_some());
        assert!(op.server.object("batch/v1", "Job", Some("default"), "migrate").is_none());
        assert!(message(&sr).contains("no table fleet"), "{}", message(&sr));
        op.stop().await;
    })
    .await;
}

/// Deletes namespace `name` of the management cluster.
async fn delete_namespace(op: &Operator, name: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(op.client.clone());
    namespaces
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// Waits until namespace `name` of the management cluster is gone; `why` names what holds it.
async fn wait_namespace_gone(op: &Operator, name: &str, within: Duration) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(op.client.clone());
    let deadline = std::time::Instant::now() + within;
    while namespaces.get_opt(name).await.unwrap().is_some() {
        let status = op
            .releases(name)
            .get_opt("shop")
            .await
            .unwrap()
            .and_then(|sr| sr.status);
        assert!(
            std::time::Instant::now() < deadline,
            "namespace {name} stays Terminating; the release's status: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A release `shop` in namespace `apps` deployed on `remote`, Ready; then its namespace on the
/// management cluster is deleted while no controller runs, and the namespace controller deletes
/// everything it can there (the Lease included) before the controller starts again.
async fn remote_release_in_a_namespace_deleted_while_no_controller_ran(
    remote: &TestApiServer,
    dir: TempDir,
) -> (Operator, TempDir) {
    let mut op = operator().await;
    op.namespace("apps").await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(remote.client());
    namespaces
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "apps"}})).unwrap(),
        )
        .await
        .unwrap();
    kubeconfig_secret(&op, "apps", "fleet-a", "value", &kubeconfig_of(remote)).await;
    op.create("apps", remote_release("shop", &dir, json!({})))
        .await;
    ready_at(&op, "apps", "shop", 1).await;
    assert_eq!(records_on(remote, "apps"), ["sh.helm.release.v1.shop.v1"]);
    op.take_controller().stop().await;

    delete_namespace(&op, "apps").await;
    // The namespace controller deletes what it can: the release's Lease goes; the release
    // stays (its finalizer), and so does the kubeconfig Secret (the finalizer the controller
    // put on it while a release used it).
    let leases = || {
        op.server
            .objects("coordination.k8s.io/v1", "Lease", Some("apps"))
            .len()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while leases() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the namespace controller never deleted the Lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secret = op
        .server
        .object("v1", "Secret", Some("apps"), "fleet-a")
        .expect("the kubeconfig Secret is kept while the release needs it");
    assert!(secret["metadata"]["deletionTimestamp"].is_string());
    let sr = op.releases("apps").get("shop").await.unwrap();
    assert!(sr.metadata.deletion_timestamp.is_some());
    (op, dir)
}

/// A controller run as the operator chart's ServiceAccount, started again.
fn controller_back(op: &Operator) -> support::operator::Controller {
    support::operator::Controller::start_configured(
        op.server
            .config_as_user("controller-back", tenants::OPERATOR_ACCOUNT, &[]),
        "controller-back",
        4,
        |_| {},
    )
}

/// The creates in namespace `namespace` of `server` from request `from` on: none may be asked
/// of a namespace being deleted.
fn creates_in(server: &TestApiServer, namespace: &str, from: usize) -> Vec<String> {
    server
        .requests()
        .iter()
        .skip(from)
        .filter(|r| {
            r.namespace.as_deref() == Some(namespace)
                && (r.verb == "create" || (r.verb == "apply" && r.status == 403))
        })
        .map(|r| format!("{} {:?} {:?} -> {}", r.verb, r.kind, r.name, r.status))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_release_whose_namespace_was_deleted_while_no_controller_ran_is_uninstalled_there()
{
    within(async {
        let remote = TestApiServer::start().await;
        let (op, _dir) =
            remote_release_in_a_namespace_deleted_while_no_controller_ran(&remote, fleet()).await;
        let from = op.server.requests().len();
        let remote_from = remote.requests().len();

        let back = controller_back(&op);
        wait_namespace_gone(&op, "apps", Duration::from_secs(60)).await;
        // Its objects and records on the remote cluster are gone, the objects in reverse layer
        // order, then its record.
        assert!(
            remote
                .object("v1", "ConfigMap", Some("apps"), "settings")
                .is_none()
        );
        assert!(
            remote
                .object("v1", "ConfigMap", Some("apps"), "app")
                .is_none()
        );
        assert!(records_on(&remote, "apps").is_empty());
        let deleted: Vec<String> = remote
            .requests()
            .iter()
            .skip(remote_from)
            .filter(|r| r.verb == "delete" && r.status < 300)
            .filter_map(|r| r.name.clone())
            .collect();
        assert_eq!(
            deleted,
            ["app", "settings", "sh.helm.release.v1.shop.v1"],
            "the deletions on the remote cluster"
        );
        // Nothing was asked to be created in the terminating namespace: no Lease, no Event, no
        // record.
        assert_eq!(creates_in(&op.server, "apps", from), Vec::<String>::new());
        back.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_cluster_unreachable_while_its_namespace_is_deleted_holds_the_namespace_and_says_so()
 {
    within(async {
        let remote = TestApiServer::start().await;
        let (op, _dir) =
            remote_release_in_a_namespace_deleted_while_no_controller_ran(&remote, fleet()).await;
        let from = op.server.requests().len();
        remote.set_down(true);

        let back = controller_back(&op);
        // The status says why the uninstall does not go on, though no event can be recorded
        // in the namespace.
        let sr = op
            .wait_release("apps", "shop", "RemoteClusterUnreachable", |sr| {
                condition(sr, "Reconciling")
                    .is_some_and(|(s, r, _)| s == "True" && r == "RemoteClusterUnreachable")
            })
            .await;
        let (_, _, text) = condition(&sr, "Reconciling").unwrap();
        assert!(
            text.contains(&format!("the remote cluster {}", remote.url()))
                && text.contains("spec.kubeConfig: Secret apps/fleet-a"),
            "{text}"
        );
        // The namespace waits for it: its objects are still there.
        assert!(
            remote
                .object("v1", "ConfigMap", Some("apps"), "app")
                .is_some()
        );
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(op.client.clone());
        assert!(namespaces.get_opt("apps").await.unwrap().is_some());

        // Back: the uninstall goes on by itself and the namespace goes.
        remote.set_down(false);
        wait_namespace_gone(&op, "apps", Duration::from_secs(90)).await;
        assert!(
            remote
                .object("v1", "ConfigMap", Some("apps"), "app")
                .is_none()
        );
        assert!(records_on(&remote, "apps").is_empty());
        assert_eq!(creates_in(&op.server, "apps", from), Vec::<String>::new());
        back.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_failure_of_an_uninstall_in_a_terminating_namespace_is_in_the_status() {
    within(async {
        // What the uninstall of a remote release in a namespace being deleted writes, all on
        // the remote cluster: its pre-delete hook, the deletion of its objects and of its
        // record (no Lease, Event or record is created in the namespace: see the test above).
        // Each fails three times; from the second failure on the status says which and why,
        // although no event can be recorded there, and the uninstall then finishes by itself.
        for (method, path, named, hooked) in [
            // A pre-delete hook runs on the remote cluster (its namespace is not being deleted).
            ("PATCH", "/jobs/cleanup", "cleanup", true),
            ("DELETE", "/configmaps/app", "ConfigMap apps/app", false),
            (
                "DELETE",
                "/configmaps/settings",
                "ConfigMap apps/settings",
                false,
            ),
            (
                "DELETE",
                "/secrets/sh.helm.release.v1.shop.v1",
                "sh.helm.release.v1.shop.v1",
                false,
            ),
        ] {
            let remote = TestApiServer::start().await;
            let _jobs = remote.job_controller(Duration::from_millis(200));
            let dir = if hooked {
                fleet_with_cleanup()
            } else {
                fleet()
            };
            let (op, _dir) =
                remote_release_in_a_namespace_deleted_while_no_controller_ran(&remote, dir).await;
            remote.fail_next(method, path, 500, 3);
            let back = controller_back(&op);
            let sr = op
                .wait_release("apps", "shop", &format!("the failure of {named}"), |sr| {
                    condition(sr, "Reconciling").is_some_and(|(s, r, m)| {
                        s == "True" && r == "ReconcileFailed" && m.contains(named)
                    })
                })
                .await;
            let (_, _, text) = condition(&sr, "Reconciling").unwrap();
            assert!(
                text.contains("500") || text.contains("Internal"),
                "{named}: {text}"
            );
            wait_namespace_gone(&op, "apps", Duration::from_secs(60)).await;
            assert!(records_on(&remote, "apps").is_empty(), "{named}");
            if hooked {
                // The hook ran, once it could be created, before anything was deleted.
                let writes: Vec<String> = remote
                    .requests()
                    .iter()
                    .filter(|r| matches!(r.verb, "apply" | "delete") && r.status < 300)
                    .filter(|r| matches!(r.kind.as_deref(), Some("Job" | "ConfigMap")))
                    .map(|r| format!("{} {}", r.verb, r.name.clone().unwrap_or_default()))
                    .collect();
                let ran = writes.iter().position(|w| w == "apply cleanup");
                let deleted = writes.iter().position(|w| w == "delete app");
                assert!(ran.is_some() && ran < deleted, "{writes:?}");
            }
            back.stop().await;
        }
    })
    .await;
}
