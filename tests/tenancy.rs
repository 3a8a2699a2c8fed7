//! Multi-tenancy on the in-process test API server, which authorizes every request with RBAC
//! as kube-apiserver does (issue "Multi-tenancy"): a release acts as its service account
//! through impersonation, a layer that account may not write is refused before any of it is
//! written, the controller's `--default-service-account` and `--no-cross-namespace-refs`, and
//! an account that loses its rights on the way.

use sequenced_testkit as support;

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use sequenced::api::ReleasePhase;
use sequenced::api::v1alpha1::SequencedRelease;
use sequenced::controller::Tenancy;
use serde_json::json;
use support::charts::{chart, condition, config_map, is_ready, message, release};
use support::operator::{Operator, is_write};
use support::tenants::{self, admin_apply};
use tempfile::TempDir;

const TEAM: &str = "team";
const DEPLOYER: &str = "system:serviceaccount:team:deployer";

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(150), test)
        .await
        .expect("the scenario did not finish in time");
}

fn status(sr: &SequencedRelease) -> &sequenced::api::SequencedReleaseStatus {
    sr.status.as_ref().expect("a status")
}

/// The operator installed with its chart (in multi-tenant mode when `tenancy` is), its controller
/// running as the chart's ServiceAccount with the chart's RBAC, with the flags `tenancy`.
async fn operator(tenancy: Tenancy) -> Operator {
    let args: &[&str] = if tenancy.is_multi_tenant() {
        &["--set", "tenancy.multiTenant=true"]
    } else {
        &[]
    };
    tenants::operator_as_chart(args, move |options| options.tenancy = tenancy).await
}

/// Namespace `namespace` with ServiceAccount `deployer`, which may do everything a release
/// does with ConfigMaps there (a Role and its RoleBinding), and nothing else.
async fn tenant(op: &Operator, namespace: &str) {
    tenants::tenant(op, namespace, tenants::config_map_rules()).await;
}

async fn bind(op: &Operator, namespace: &str) {
    admin_apply(
        op,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "deployer", "namespace": namespace},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployer"},
               "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": namespace}]}),
    )
    .await;
}

/// Chart `name`: layer `config` (ConfigMap `settings`), then layer `more` (ConfigMap `more`
/// and whatever `extra` holds), which depends on it.
fn two_layers(name: &str, extra: &str) -> TempDir {
    chart(
        name,
        &[
            (
                "templates/settings.yaml",
                &config_map("settings", "helm.sh/layer: config"),
            ),
            (
                "templates/more.yaml",
                &format!(
                    "{}{extra}",
                    config_map(
                        "more",
                        "helm.sh/layer: more\n    helm.sh/depends-on/layers: config"
                    )
                ),
            ),
            ("values.yaml", "version: 1\n"),
        ],
    )
}

/// Creates release `app` of chart `app` in `dir`, in namespace `team`, acting as `deployer`.
async fn deploy_as_deployer(op: &Operator, dir: &TempDir) {
    op.create(
        TEAM,
        release(
            "app",
            &dir.path().join("app"),
            json!({"serviceAccountName": "deployer"}),
        ),
    )
    .await;
}

fn config_maps(op: &Operator, namespace: &str) -> Api<ConfigMap> {
    Api::namespaced(op.client.clone(), namespace)
}

async fn failed_with(op: &Operator, namespace: &str, name: &str, reason: &str) -> SequencedRelease {
    op.wait_release(namespace, name, &format!("Stalled {reason}"), |sr| {
        condition(sr, "Stalled").is_some_and(|(s, r, _)| s == "True" && r == reason)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_acts_as_its_service_account_for_its_objects_and_as_the_controller_for_its_books()
{
    within(async {
        let op = operator(Tenancy::default()).await;
        tenant(&op, TEAM).await;
        let dir = two_layers("app", "");
        deploy_as_deployer(&op, &dir).await;
        let sr = op.wait_release(TEAM, "app", "Ready", is_ready).await;
        assert_eq!(
            status(&sr).acting_as.as_deref(),
            Some("serviceaccount team:deployer")
        );
        let objects = config_maps(&op, TEAM);
        assert!(objects.get_opt("settings").await.unwrap().is_some());
        assert!(objects.get_opt("more").await.unwrap().is_some());

        let requests = op.server.requests();
        let controller: Vec<_> = requests
            .iter()
            .filter(|r| r.client.as_deref() == Some("test-controller"))
            .collect();
        // Every request about the chart's ConfigMaps (reads, applies, watches) is the account's.
        // (Looking for Helm's records of the release name kept as ConfigMaps, `owner=helm`, is
        // the controller's, as the records are.)
        let chart_objects: Vec<_> = controller
            .iter()
            .filter(|r| r.kind.as_deref() == Some("ConfigMap"))
            .filter(|r| !r.query.contains("owner%3Dhelm") && !r.query.contains("owner=helm"))
            .collect();
        assert!(chart_objects.iter().any(|r| r.verb == "apply"));
        for r in &chart_objects {
            assert_eq!(
                r.user.as_deref(),
                Some(DEPLOYER),
                "{} {} {}?{} was sent as the controller",
                r.method,
                r.path,
                r.kind.as_deref().unwrap_or(""),
                r.query
            );
        }
        // Its own books are the controller's: the status, the records, the Lease, events.
        for kind in ["SequencedRelease", "Secret", "Lease", "Event"] {
            let writes: Vec<_> = controller
                .iter()
                .filter(|r| r.kind.as_deref() == Some(kind) && is_write(r))
                .collect();
            assert!(!writes.is_empty(), "no {kind} was written");
            assert!(
                writes
                    .iter()
                    .all(|r| r.user.as_deref() == Some(tenants::OPERATOR_ACCOUNT)),
                "a {kind} was written as the service account"
            );
        }
        // One access question per kind, namespace and verb (create, patch, get, list, watch),
        // answered once for both layers of ConfigMaps.
        let reviews = controller
            .iter()
            .filter(|r| r.path.ends_with("/selfsubjectaccessreviews"))
            .count();
        assert_eq!(reviews, 5);
        // Nothing was refused on the way.
        assert!(
            controller.iter().all(|r| r.status != 403),
            "a request was refused"
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_the_account_may_not_write_is_forbidden_before_any_of_it_is_written() {
    within(async {
        let op = operator(Tenancy::default()).await;
        tenant(&op, TEAM).await;
        let role = "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: escalate\n  annotations:\n    helm.sh/layer: more\n    helm.sh/depends-on/layers: config\nrules: []\n";
        // It may read ClusterRoles (so the controller can see whose one is), not create them.
        admin_apply(
            &op,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": "read-clusterroles"},
                   "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                              "verbs": ["get", "list", "watch"]}]}),
        )
        .await;
        admin_apply(
            &op,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": "team-read-clusterroles"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "read-clusterroles"},
                   "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": TEAM}]}),
        )
        .await;
        let dir = two_layers("app", role);
        deploy_as_deployer(&op, &dir).await;
        let sr = failed_with(&op, TEAM, "app", "Forbidden").await;
        assert_eq!(status(&sr).phase, Some(ReleasePhase::Failed));
        let said = message(&sr);
        assert!(
            said.contains(
                "serviceaccount team:deployer cannot create clusterroles.rbac.authorization.k8s.io \"escalate\""
            ),
            "{said}"
        );
        let (ready, reason, _) = condition(&sr, "Ready").unwrap();
        assert_eq!((ready.as_str(), reason.as_str()), ("False", "Forbidden"));
        // The first layer is deployed; of the refused layer nothing was written.
        let objects = config_maps(&op, TEAM);
        assert!(objects.get_opt("settings").await.unwrap().is_some());
        assert!(objects.get_opt("more").await.unwrap().is_none());
        let requests = op.server.requests();
        assert!(
            !requests.iter().any(|r| is_write(r)
                && r.name.as_deref().is_some_and(|n| n == "more" || n == "escalate")),
            "an object of the refused layer was written"
        );
        // It was asked before, as the account: a SelfSubjectAccessReview.
        assert!(requests.iter().any(|r| r.path.ends_with("/selfsubjectaccessreviews")
            && r.user.as_deref() == Some(DEPLOYER)));
        let layer = status(&sr)
            .layers
            .iter()
            .find(|l| l.name == "more")
            .expect("layer more");
        assert!(
            layer
                .message
                .as_deref()
                .is_some_and(|m| m.contains("cannot create clusterroles")),
            "{layer:?}"
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_service_account_is_used_in_each_release_namespace() {
    within(async {
        let op = operator(Tenancy {
            default_service_account: Some("deployer".into()),
            allow_local_charts: vec![std::env::temp_dir()],
            require_verified_charts: false,
            ..Tenancy::default()
        })
        .await;
        tenant(&op, TEAM).await;
        // In `bare` the account exists but was granted nothing.
        op.namespace("bare").await;
        admin_apply(
            &op,
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "deployer", "namespace": "bare"}}),
        )
        .await;
        let dir = two_layers("app", "");
        for ns in [TEAM, "bare"] {
            op.create(ns, release("app", &dir.path().join("app"), json!({})))
                .await;
        }
        let sr = op.wait_release(TEAM, "app", "Ready", is_ready).await;
        assert_eq!(
            status(&sr).acting_as.as_deref(),
            Some("serviceaccount team:deployer")
        );
        let refused = failed_with(&op, "bare", "app", "Forbidden").await;
        let said = message(&refused);
        assert!(
            said.contains("serviceaccount bare:deployer cannot") && said.contains("configmaps"),
            "{said}"
        );
        assert!(
            config_maps(&op, "bare")
                .get_opt("settings")
                .await
                .unwrap()
                .is_none()
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn references_outside_the_release_namespace_are_refused_with_the_flag() {
    within(async {
        let op = operator(Tenancy {
                no_cross_namespace_refs: true,
                ..Tenancy::default()
            })
        .await;
        op.namespace(TEAM).await;
        op.namespace("elsewhere").await;
        let dir = two_layers("app", "");
        let path = dir.path().join("app");
        op.create(
            TEAM,
            release("target", &path, json!({"targetNamespace": "elsewhere"})),
        )
        .await;
        op.create(
            TEAM,
            release(
                "depends",
                &path,
                json!({"releaseName": "depends", "dependsOn": [{"name": "db", "namespace": "elsewhere"}]}),
            ),
        )
        .await;
        op.create(TEAM, release("local", &path, json!({"releaseName": "local", "targetNamespace": TEAM})))
            .await;
        let target = failed_with(&op, TEAM, "target", "CrossNamespaceRef").await;
        assert!(
            message(&target).contains("spec.targetNamespace elsewhere"),
            "{}",
            message(&target)
        );
        let depends = failed_with(&op, TEAM, "depends", "CrossNamespaceRef").await;
        assert!(
            message(&depends).contains("spec.dependsOn[0] elsewhere/db"),
            "{}",
            message(&depends)
        );
        // Naming its own namespace is no cross-namespace reference.
        op.wait_release(TEAM, "local", "Ready", is_ready).await;
        assert!(
            config_maps(&op, "elsewhere")
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .is_empty(),
            "something was deployed to the other namespace"
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_that_loses_its_rights_is_stalled_and_its_uninstall_says_why_until_they_are_back()
 {
    within(async {
        let op = operator(Tenancy::default()).await;
        tenant(&op, TEAM).await;
        let dir = two_layers("app", "");
        deploy_as_deployer(&op, &dir).await;
        op.wait_release(TEAM, "app", "Ready", is_ready).await;
        let bindings: Api<RoleBinding> = Api::namespaced(op.client.clone(), TEAM);
        bindings
            .delete("deployer", &DeleteParams::default())
            .await
            .unwrap();
        // An upgrade now cannot apply anything.
        op.releases(TEAM)
            .patch(
                "app",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"values": {"version": 2}}})),
            )
            .await
            .unwrap();
        let sr = failed_with(&op, TEAM, "app", "Forbidden").await;
        assert!(
            message(&sr).contains("serviceaccount team:deployer cannot"),
            "{}",
            message(&sr)
        );
        // Nor delete: the uninstall stays, Stalled, saying why, instead of hanging silently.
        op.releases(TEAM)
            .delete("app", &DeleteParams::default())
            .await
            .unwrap();
        let blocked = op
            .wait_release(TEAM, "app", "uninstall Stalled Forbidden", |sr| {
                sr.metadata.deletion_timestamp.is_some()
                    && condition(sr, "Stalled").is_some_and(|(s, r, m)| {
                        s == "True" && r == "Forbidden" && m.contains("cannot")
                    })
            })
            .await;
        assert!(
            message(&blocked).contains("serviceaccount team:deployer cannot"),
            "{}",
            message(&blocked)
        );
        assert!(
            config_maps(&op, TEAM)
                .get_opt("settings")
                .await
                .unwrap()
                .is_some()
        );
        // Rights back: the uninstall finishes.
        bind(&op, TEAM).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while op.releases(TEAM).get_opt("app").await.unwrap().is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "the uninstall never finished once the rights were back"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            config_maps(&op, TEAM)
                .get_opt("settings")
                .await
                .unwrap()
                .is_none()
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_multi_tenant_chart_grants_the_controller_all_it_needs_to_deploy_as_tenants() {
    within(async {
        let op = Operator::without_controller().await;
        // The operator chart's service account and RBAC, as `helm install` would create them.
        tenants::install_operator_rbac(&op, &["--set", "tenancy.multiTenant=true"]).await;
        tenant(&op, TEAM).await;
        let account = tenants::OPERATOR_ACCOUNT;
        let controller = support::operator::Controller::start_as(
            op.server.config_as_user("test-controller", account, &[]),
            "test-controller",
            2,
            Tenancy {
                default_service_account: Some("deployer".into()),
                no_cross_namespace_refs: true,
                allow_local_charts: vec![std::env::temp_dir()],
                require_verified_charts: false,
                ..Tenancy::default()
            },
        );
        let dir = two_layers("app", "");
        op.create(TEAM, release("app", &dir.path().join("app"), json!({})))
            .await;
        let sr = op.wait_release(TEAM, "app", "Ready", is_ready).await;
        assert_eq!(
            status(&sr).acting_as.as_deref(),
            Some("serviceaccount team:deployer")
        );
        let refused = tenants::refused(&op, "test-controller");
        assert_eq!(refused, Vec::<String>::new(), "refused requests");
        let own = op
            .server
            .requests()
            .iter()
            .filter(|r| r.client.as_deref() == Some("test-controller") && is_write(r))
            .filter(|r| r.user.as_deref() == Some(account))
            .count();
        assert!(
            own > 0,
            "the controller did not act as the chart's service account"
        );
        // The controller's own identity wrote only its books.
        assert_eq!(
            tenants::beyond_books(&op, "test-controller", account),
            Vec::<String>::new()
        );
        controller.stop().await;
    })
    .await;
}

/// The tenant's account as [`tenant`] makes it, but its Role lacks list and watch of ConfigMaps.
async fn may_not_list_configmaps(op: &Operator) {
    admin_apply(
        op,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "deployer", "namespace": TEAM},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                          "verbs": ["get", "create", "patch", "delete"]}]}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_that_may_write_but_not_watch_is_told_so_before_anything_is_written() {
    within(async {
        let op = operator(Tenancy::default()).await;
        tenant(&op, TEAM).await;
        may_not_list_configmaps(&op).await;
        let dir = two_layers("app", "");
        deploy_as_deployer(&op, &dir).await;
        let sr = failed_with(&op, TEAM, "app", "Forbidden").await;
        let said = message(&sr);
        assert!(
            said.contains("serviceaccount team:deployer cannot list configmaps in namespace team"),
            "{said}"
        );
        assert!(
            config_maps(&op, TEAM)
                .get_opt("settings")
                .await
                .unwrap()
                .is_none()
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_that_may_not_watch_a_kind_it_manages_is_asked_a_bounded_number_of_times() {
    within(async {
        let op = operator(Tenancy::default()).await;
        tenant(&op, TEAM).await;
        may_not_list_configmaps(&op).await;
        let dir = two_layers("app", "");
        deploy_as_deployer(&op, &dir).await;
        failed_with(&op, TEAM, "app", "Forbidden").await;
        // What the refused account is asked from then on: its watches of ConfigMaps back off
        // as client-go's reflector does (from 800 ms, doubling, to 30 s), not every few seconds.
        let from = op.server.requests().len();
        let window = Duration::from_secs(40);
        tokio::time::sleep(window).await;
        let asked: Vec<String> = op.server.requests()[from..]
            .iter()
            .filter(|r| {
                r.user.as_deref() == Some(DEPLOYER) && r.kind.as_deref() == Some("ConfigMap")
            })
            .filter(|r| matches!(r.verb, "list" | "watch"))
            .map(tenants::describe)
            .collect();
        eprintln!(
            "{} lists and watches of ConfigMaps as the account in {window:?}",
            asked.len()
        );
        // Two watches (this replica's shards, and objects of no shard), each asking again after
        // 0.8, 1.6, 3.2, 6.4, 12.8 and 25.6 s (±25 %): about 10. It was over 300 (the `Init` a
        // watcher yields before each list attempt reset the backoff), and 26 with the backoff of
        // an outage (at most 4 s).
        assert!(
            asked.len() <= 12,
            "{} in {window:?}: {asked:#?}",
            asked.len()
        );
        op.stop().await;
    })
    .await;
}

/// The requests made as the release's account for ClusterRole `name` from request `from` on (the
/// watch of ClusterRoles its release asked for is counted apart).
fn asked_for_cluster_role(op: &Operator, name: &str, from: usize) -> Vec<String> {
    op.server
        .requests()
        .iter()
        .skip(from)
        .filter(|r| r.user.as_deref() == Some(DEPLOYER) && r.kind.as_deref() == Some("ClusterRole"))
        .filter(|r| r.name.as_deref() == Some(name))
        .map(tenants::describe)
        .collect()
}

/// Deletes release `app` of `TEAM` and waits, a few seconds at most, until it is gone.
async fn deleted_within_seconds(op: &Operator) {
    op.releases(TEAM)
        .delete("app", &DeleteParams::default())
        .await
        .unwrap();
    op.wait_deleted_within(TEAM, "app", Duration::from_secs(10))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_stalled_forbidden_before_it_applied_anything_is_gone_at_once_when_deleted() {
    within(async {
        let op = operator(Tenancy::default()).await;
        tenant(&op, TEAM).await;
        // Its only layer holds a ClusterRole the account may neither read nor write.
        let dir = chart(
            "app",
            &[(
                "templates/role.yaml",
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: escalate\nrules: []\n",
            )],
        );
        deploy_as_deployer(&op, &dir).await;
        let sr = failed_with(&op, TEAM, "app", "Forbidden").await;
        assert!(message(&sr).contains("clusterroles"), "{}", message(&sr));
        let from = op.server.requests().len();

        deleted_within_seconds(&op).await;
        // Nothing of it was applied: nothing is looked for, least of all as the account that was
        // refused it.
        assert_eq!(asked_for_cluster_role(&op, "escalate", from), Vec::<String>::new());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_stalled_forbidden_after_its_first_layer_uninstalls_that_layer_when_deleted() {
    within(async {
        let op = operator(Tenancy::default()).await;
        tenant(&op, TEAM).await;
        let role = "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: escalate\n  annotations:\n    helm.sh/layer: more\n    helm.sh/depends-on/layers: config\nrules: []\n";
        let dir = two_layers("app", role);
        deploy_as_deployer(&op, &dir).await;
        failed_with(&op, TEAM, "app", "Forbidden").await;
        let objects = config_maps(&op, TEAM);
        assert!(objects.get_opt("settings").await.unwrap().is_some());
        let from = op.server.requests().len();

        deleted_within_seconds(&op).await;
        // The layer it applied is uninstalled; the refused one, never applied, is not looked for.
        assert!(objects.get_opt("settings").await.unwrap().is_none());
        assert_eq!(asked_for_cluster_role(&op, "escalate", from), Vec::<String>::new());
        op.stop().await;
    })
    .await;
}
