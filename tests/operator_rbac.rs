//! The operator chart's RBAC and admission policy as a cluster enforces them: the controller
//! runs on the test API server as the chart's own ServiceAccount, with the RBAC objects, the
//! ValidatingAdmissionPolicy and the flags `helm template` renders, and every request it sends is
//! authorized and admitted as kube-apiserver would (issue 33, "Least privilege in the chart").
//!
//! - Multi-tenant mode with the release-records policy and `rbac.releaseNamespaces`: a release
//!   installs, upgrades, fails a hook (whose log is read as the release's account) and
//!   uninstalls with nothing refused to the controller, its records written by its own identity;
//!   a Secret write by that identity that is not a record is refused by the policy, and one
//!   outside the release namespaces by RBAC.
//! - `rbac.profile: restricted`: a chart of a Deployment, a Service and a ConfigMap installs; a
//!   chart with a ClusterRole is refused, Stalled `Forbidden`, naming the verb and the resource.

use sequenced_testkit as support;

use std::future::Future;
use std::time::Duration;

use clap::Parser as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use sequenced::api::ReleasePhase;
use sequenced::api::v1alpha1::SequencedRelease;
use sequenced::controller::Tenancy;
use serde_json::{Value, json};
use support::apiserver::RecordedRequest;
use support::charts::{chart, condition, config_map, deployment, is_ready, is_stalled, release};
use support::operator::{Controller, Operator, is_write};
use support::tenants::{self, OPERATOR_ACCOUNT as CONTROLLER, OPERATOR_NAMESPACE};

const TEAM: &str = "team";
const DEPLOYER: &str = "system:serviceaccount:team:deployer";
/// The name the controller's requests are recorded under.
const CLIENT: &str = "chart-controller";

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(240), test)
        .await
        .expect("the scenario did not finish in time");
}

/// Installs what the operator chart renders with `args` as `helm install` would (its
/// ServiceAccount, RBAC and admission policy; not the Deployment, which runs in-process here),
/// and starts the controller as that ServiceAccount with the flags the Deployment would run it
/// with. Namespaces `namespaces` exist first (RoleBindings go into them).
async fn install_operator(op: &Operator, args: &[&str], namespaces: &[&str]) -> Controller {
    for ns in namespaces {
        op.namespace(ns).await;
    }
    tenants::install_operator_rbac(op, args).await;
    let docs = tenants::operator_chart(OPERATOR_NAMESPACE, args);
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the chart's Deployment");
    let flags: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("the controller's args")
        .iter()
        .filter_map(|a| a.as_str().map(String::from))
        .collect();
    // The flags as `sequenced run` reads them.
    let cli = sequenced::cli::Cli::try_parse_from(
        std::iter::once("sequenced".to_string()).chain(flags.iter().cloned()),
    )
    .unwrap_or_else(|e| panic!("sequenced {flags:?}: {e}"));
    let sequenced::cli::Command::Run(run) = cli.command else {
        panic!("the Deployment does not run `sequenced run`: {flags:?}")
    };
    let tenancy = Tenancy {
        default_service_account: run.default_service_account.clone(),
        no_cross_namespace_refs: run.no_cross_namespace_refs,
        multi_tenant: run.multi_tenant,
        allow_local_charts: run.allow_local_charts.clone(),
        require_verified_charts: run.require_verified_charts,
    };
    // The shard Leases in the operator's namespace (POD_NAMESPACE), as in the pod.
    let sharding = sequenced::lock::Sharding {
        namespace: OPERATOR_NAMESPACE.to_string(),
        lease_duration: Duration::from_secs(3),
        ..sequenced::lock::Sharding::default()
    };
    Controller::start_sharded(
        op.server.config_as_user(CLIENT, CONTROLLER, &[]),
        CLIENT,
        2,
        tenancy,
        sharding,
    )
}

/// The controller's requests that the server refused (RBAC, or an admission policy).
fn refused(op: &Operator) -> Vec<String> {
    tenants::refused(op, CLIENT)
}

fn status(sr: &SequencedRelease) -> &sequenced::api::SequencedReleaseStatus {
    sr.status.as_ref().expect("a status")
}

async fn set_values(op: &Operator, values: Value) {
    op.releases(TEAM)
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"values": values}})),
        )
        .await
        .expect("patch the release's values");
}

/// The release records of `app` in the team's namespace, by name.
async fn records(op: &Operator) -> Vec<String> {
    let secrets: Api<Secret> = Api::namespaced(op.client.clone(), TEAM);
    let mut names: Vec<String> = secrets
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.type_.as_deref() == Some("helm.sh/release.v1"))
        .filter_map(|s| s.metadata.name)
        .collect();
    names.sort();
    names
}

/// The rights of the team's ServiceAccount `deployer`: what the chart of [`hooked_chart`] holds
/// in its namespace, and reading its hook pods' logs.
fn hooked_chart_rules() -> Value {
    let all = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    json!([
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": all},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": all},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}
    ])
}

/// Chart `app`: ConfigMap `settings` (its data the value `version`), and a pre-upgrade hook
/// Job `migrate` whose Pod fails when the value `outcome` is `fail`, printing a log.
fn hooked_chart() -> tempfile::TempDir {
    let migrate = format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\n  labels:\n    {outcome}: {{{{ .Values.outcome }}}}\n  annotations:\n    helm.sh/hook: pre-upgrade\nspec:\n  backoffLimit: 0\n  template:\n    metadata:\n      labels:\n        {outcome}: {{{{ .Values.outcome }}}}\n      annotations:\n        {log}: \"applying migration {{{{ .Values.version }}}}\\nERROR: relation users is locked\\n\"\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: main\n          image: busybox:1.36\n          command: [\"sh\", \"-c\", \"true\"]\n",
        outcome = support::workloads::OUTCOME_LABEL,
        log = support::workloads::LOG_ANNOTATION,
    );
    let settings = config_map("settings", "helm.sh/layer: config")
        .replace("  a: b\n", "  version: \"{{ .Values.version }}\"\n");
    chart(
        "app",
        &[
            ("templates/settings.yaml", settings.as_str()),
            ("templates/migrate.yaml", migrate.as_str()),
            ("values.yaml", "version: 1\noutcome: pass\n"),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_multi_tenant_chart_and_its_record_policy_let_the_controller_keep_its_books_and_nothing_more()
 {
    within(async {
        let op = Operator::without_controller().await;
        tenants::tenant(&op, TEAM, hooked_chart_rules()).await;
        let charts = std::env::temp_dir();
        let local = format!("tenancy.allowLocalCharts={{{}}}", charts.display());
        let controller = install_operator(
            &op,
            &[
                "--set",
                "tenancy.multiTenant=true",
                "--set",
                "tenancy.defaultServiceAccount=deployer",
                "--set",
                &local,
                "--set",
                "rbac.releaseNamespaces={team}",
            ],
            &["elsewhere"],
        )
        .await;
        // The policy is installed, with the chart's name.
        assert!(
            op.server
                .object(
                    "admissionregistration.k8s.io/v1",
                    "ValidatingAdmissionPolicy",
                    None,
                    "sequenced-release-records"
                )
                .is_some()
        );
        let _jobs = op.job_controller(Duration::from_millis(50));
        let dir = hooked_chart();
        op.create(TEAM, release("app", &dir.path().join("app"), json!({})))
            .await;
        let sr = op.wait_release(TEAM, "app", "Ready", is_ready).await;
        assert_eq!(
            status(&sr).acting_as.as_deref(),
            Some("serviceaccount team:deployer")
        );

        // An upgrade runs the pre-upgrade hook, which succeeds.
        set_values(&op, json!({"version": 2})).await;
        op.wait_release(TEAM, "app", "revision 2 Ready", |sr| {
            is_ready(sr) && status(sr).revision == Some(2)
        })
        .await;
        let settings: Api<ConfigMap> = Api::namespaced(op.client.clone(), TEAM);
        assert_eq!(
            settings.get("settings").await.unwrap().data.unwrap()["version"],
            "2"
        );

        // The next one fails its hook: the status tells the pod's log, read as the account.
        set_values(&op, json!({"version": 3, "outcome": "fail"})).await;
        let sr = op.wait_release(TEAM, "app", "Stalled", is_stalled).await;
        let (_, reason, text) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "HookFailed", "{text}");
        assert!(
            text.contains("ERROR: relation users is locked"),
            "the hook's log is not in the status: {text}"
        );
        let log_reads: Vec<RecordedRequest> = op
            .server
            .requests()
            .into_iter()
            .filter(|r| r.client.as_deref() == Some(CLIENT) && r.path.ends_with("/log"))
            .collect();
        assert!(!log_reads.is_empty(), "the hook's log was not read");
        for r in &log_reads {
            assert_eq!(r.user.as_deref(), Some(DEPLOYER), "{}", tenants::describe(r));
            assert_eq!(r.status, 200, "{}", tenants::describe(r));
        }
        assert_eq!(
            records(&op).await,
            [
                "sh.helm.release.v1.app.v1",
                "sh.helm.release.v1.app.v2",
                "sh.helm.release.v1.app.v3"
            ]
        );

        // The uninstall takes the objects and the records away.
        op.releases(TEAM)
            .delete("app", &DeleteParams::default())
            .await
            .unwrap();
        op.wait_deleted(TEAM, "app").await;
        assert!(settings.get_opt("settings").await.unwrap().is_none());
        assert_eq!(records(&op).await, Vec::<String>::new());

        // Nothing the controller asked for was refused, by RBAC or by the policy.
        assert_eq!(refused(&op), Vec::<String>::new(), "refused requests");
        // It wrote, as itself, its books only, and Secrets only as records.
        let requests = op.server.requests();
        let own: Vec<&RecordedRequest> = requests
            .iter()
            .filter(|r| r.client.as_deref() == Some(CLIENT) && is_write(r))
            .filter(|r| r.user.as_deref() == Some(CONTROLLER))
            .collect();
        for kind in ["SequencedRelease", "Secret", "Lease", "Event"] {
            assert!(
                own.iter().any(|r| r.kind.as_deref() == Some(kind)),
                "no {kind} was written by the controller's identity"
            );
        }
        assert_eq!(
            tenants::beyond_books(&op, CLIENT, CONTROLLER),
            Vec::<String>::new()
        );
        for r in requests
            .iter()
            .filter(|r| r.client.as_deref() == Some(CLIENT) && is_write(r))
        {
            assert!(
                r.user.as_deref() == Some(CONTROLLER) || r.user.as_deref() == Some(DEPLOYER),
                "{}",
                tenants::describe(r)
            );
        }
        controller.stop().await;

        // The controller's identity, used for anything else, is refused: a Secret that is not
        // a record by the policy, in a namespace where releases live ...
        let stolen = op.server.client_as_user("stolen-token", CONTROLLER, &[]);
        let team_secrets: Api<Secret> = Api::namespaced(stolen.clone(), TEAM);
        let secret: Secret = serde_json::from_value(
            json!({"metadata": {"name": "db-password"}, "stringData": {"password": "hunter2"}}),
        )
        .unwrap();
        let denied = team_secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect_err("a Secret that is not a record");
        let kube::Error::Api(denied) = denied else {
            panic!("{denied}")
        };
        assert_eq!((denied.code, denied.reason.as_str()), (403, "Forbidden"));
        assert_eq!(
            denied.message,
            "secrets \"db-password\" is forbidden: ValidatingAdmissionPolicy 'sequenced-release-records' with binding 'sequenced-release-records' denied request: the sequenced operator may write only its release records (Secrets of type helm.sh/release.v1 named sh.helm.release.v1.*), not Secret db-password"
        );
        // ... nor a tenant's own Secret changed or deleted, though RBAC allows Secrets there ...
        let admin_secrets: Api<Secret> = Api::namespaced(op.client.clone(), TEAM);
        admin_secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let changed = team_secrets
            .patch(
                "db-password",
                &PatchParams::default(),
                &Patch::Merge(json!({"stringData": {"password": "mine"}})),
            )
            .await;
        assert!(
            matches!(&changed, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("ValidatingAdmissionPolicy 'sequenced-release-records'")),
            "{changed:?}"
        );
        let deleted = team_secrets
            .delete("db-password", &DeleteParams::default())
            .await;
        assert!(
            matches!(&deleted, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("denied request")),
            "{deleted:?}"
        );
        // ... and no Secret at all where no release may live: RBAC says no.
        let elsewhere: Api<Secret> = Api::namespaced(stolen.clone(), "elsewhere");
        let forbidden = elsewhere
            .create(&PostParams::default(), &secret)
            .await
            .expect_err("outside rbac.releaseNamespaces");
        assert!(
            forbidden.to_string().contains(
                "cannot create resource \"secrets\" in API group \"\" in the namespace \"elsewhere\""
            ),
            "{forbidden}"
        );
        assert!(
            elsewhere.list(&Default::default()).await.is_err(),
            "it may read Secrets outside the release namespaces"
        );
    })
    .await;
}

/// Chart `shop`: a ConfigMap, a Service and a Deployment.
fn shop_chart() -> tempfile::TempDir {
    let service = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations:\n    helm.sh/layer: app\nspec:\n  selector:\n    app: web\n  ports:\n    - port: 80\n";
    chart(
        "shop",
        &[
            (
                "templates/config.yaml",
                &config_map("config", "helm.sh/layer: config"),
            ),
            ("templates/service.yaml", service),
            (
                "templates/web.yaml",
                &deployment(
                    "web",
                    "helm.sh/layer: app\n    helm.sh/depends-on/layers: config",
                ),
            ),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restricted_profile_installs_namespaced_workloads_and_refuses_a_cluster_role_saying_why()
 {
    within(async {
        let op = Operator::without_controller().await;
        let controller =
            install_operator(&op, &["--set", "rbac.profile=restricted"], &["apps"]).await;
        let _kubelet = op.kubelet();
        let shop = shop_chart();
        op.create("apps", release("shop", &shop.path().join("shop"), json!({})))
            .await;
        op.wait_release("apps", "shop", "Ready", is_ready).await;
        for (api_version, kind, name) in [
            ("v1", "ConfigMap", "config"),
            ("v1", "Service", "web"),
            ("apps/v1", "Deployment", "web"),
        ] {
            assert!(
                op.server
                    .object(api_version, kind, Some("apps"), name)
                    .is_some(),
                "{kind} {name} was not applied"
            );
        }
        assert_eq!(refused(&op), Vec::<String>::new(), "refused requests");

        // A chart that needs a cluster-scoped kind is refused, and the status says what the
        // controller may not do.
        let role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: shop-reader\n  annotations:\n    helm.sh/layer: access\n    helm.sh/depends-on/layers: config\nrules: []\n";
        let needy = chart(
            "needy",
            &[
                (
                    "templates/config.yaml",
                    &config_map("needy-config", "helm.sh/layer: config"),
                ),
                ("templates/role.yaml", role),
            ],
        );
        op.create("apps", release("needy", &needy.path().join("needy"), json!({})))
            .await;
        let sr = op
            .wait_release("apps", "needy", "Stalled Forbidden", |sr| {
                condition(sr, "Stalled").is_some_and(|(s, r, _)| s == "True" && r == "Forbidden")
            })
            .await;
        assert_eq!(status(&sr).phase, Some(ReleasePhase::Failed));
        let (_, _, said) = condition(&sr, "Stalled").unwrap();
        assert!(
            said.contains(&format!("the controller ({CONTROLLER}) cannot"))
                && said.contains("clusterroles.rbac.authorization.k8s.io \"shop-reader\""),
            "{said}"
        );
        assert!(
            op.server
                .object("rbac.authorization.k8s.io/v1", "ClusterRole", None, "shop-reader")
                .is_none()
        );
        // The layer before it is deployed; the release that fits is untouched.
        assert!(
            op.server
                .object("v1", "ConfigMap", Some("apps"), "needy-config")
                .is_some()
        );
        assert!(is_ready(&op.releases("apps").get("shop").await.unwrap()));
        controller.stop().await;
    })
    .await;
}
