//! The tenant-attack suite (issue "A cluster you can hand to strangers"): each scenario is one of
//! the holes a tenant found in multi-tenant mode, tried as that tenant would, on the test API
//! server, with the controller running as the operator chart's own ServiceAccount with the RBAC
//! the chart renders for `tenancy.multiTenant: true` (never as the cluster's administrator).
//! Each asserts what a user sees: the Stalled reason and message, nothing written outside the
//! tenant's namespace, the other tenant's chart not served, the operator alive and serving the
//! others, no secret value in any status, event, helm command line or record of requests.

use sequenced_testkit as support;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use sequenced::api::v1alpha1::SequencedRelease;
use sequenced::controller::{Options, Tenancy};
use sequenced::helm::Timeouts;
use serde_json::{Value, json};
use support::charts::{chart, condition, config_map, is_ready, message, release};
use support::http::{Response, Server, serve_dir};
use support::operator::{Controller, Operator};
use support::tenants::{self, DEPLOYER, OPERATOR_ACCOUNT, admin_apply};
use tempfile::TempDir;

const TEAM_A: &str = "team-a";
const TEAM_B: &str = "team-b";

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(240), test)
        .await
        .expect("the scenario did not finish in time");
}

/// The rights of a team's `deployer`: ConfigMaps, and reading its Secrets.
fn team_rules() -> Value {
    json!([
        {"apiGroups": [""], "resources": ["configmaps"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}
    ])
}

/// The operator installed with its chart in multi-tenant mode, its controller running as the
/// chart's ServiceAccount ([`controller`]).
async fn lockdown(charts: &[&Path], configure: impl FnOnce(&mut Options)) -> Operator {
    let mut op = Operator::without_controller().await;
    tenants::install_operator_rbac(&op, &["--set", "tenancy.multiTenant=true"]).await;
    let controller = controller(&op, charts, configure);
    op.adopt(controller);
    op
}

/// A controller as the chart's ServiceAccount in multi-tenant mode: releases act as `deployer`
/// (the chart's default is `default`; a team's account here), local charts are allowed only
/// under `charts`, chart sources only on loopback (the test's repositories), and `configure`
/// sets the rest.
fn controller(op: &Operator, charts: &[&Path], configure: impl FnOnce(&mut Options)) -> Controller {
    let allowed: Vec<PathBuf> = charts.iter().map(|p| p.to_path_buf()).collect();
    Controller::start_configured(
        op.server
            .config_as_user("test-controller", OPERATOR_ACCOUNT, &[]),
        "test-controller",
        4,
        move |options| {
            options.tenancy = Tenancy {
                default_service_account: Some(DEPLOYER.into()),
                no_cross_namespace_refs: true,
                multi_tenant: true,
                allow_local_charts: allowed,
                require_verified_charts: false,
            };
            options.cache =
                options
                    .cache
                    .clone()
                    .with_policy(sequenced::chart::egress::SourcePolicy {
                        allow: vec!["127.0.0.1/32".parse().unwrap()],
                        deny: Vec::new(),
                        multi_tenant: true,
                    });
            configure(options);
        },
    )
}

async fn stalled_with(
    op: &Operator,
    namespace: &str,
    name: &str,
    reason: &str,
) -> SequencedRelease {
    op.wait_release(namespace, name, &format!("Stalled {reason}"), |sr| {
        condition(sr, "Stalled").is_some_and(|(s, r, _)| s == "True" && r == reason)
    })
    .await
}

/// Waits until the release's Ready condition says `text` (a failure retried with backoff, as a
/// download is, says why in its conditions).
async fn failing_with(op: &Operator, namespace: &str, name: &str, text: &str) -> String {
    let sr = op
        .wait_release(namespace, name, &format!("Ready False: {text}"), |sr| {
            condition(sr, "Ready").is_some_and(|(s, _, m)| s == "False" && m.contains(text))
        })
        .await;
    condition(&sr, "Ready").map(|c| c.2).unwrap_or_default()
}

/// Every text a user of the release can read: its status, its events, and the requests the
/// server recorded (bodies included), for a secret that must appear in none of them.
async fn readable(op: &Operator, namespace: &str, name: &str) -> String {
    let sr = op.releases(namespace).get(name).await.expect("the release");
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(op.client.clone(), namespace);
    let notes: Vec<String> = events
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter_map(|e| e.note)
        .collect();
    format!(
        "{}\n{}",
        serde_json::to_string(&sr.status).unwrap_or_default(),
        notes.join("\n")
    )
}

/// The SequencedRelease CRD as it was before it checked names: without the patterns and
/// lengths of `serviceAccountName`, `chart.name` and `chart.oci`, for objects admitted then.
async fn admit_as_before(op: &Operator) {
    let crds: Api<CustomResourceDefinition> = Api::all(op.client.clone());
    let crd = crds.get("sequencedreleases.sequenced.dev").await.unwrap();
    let mut crd = serde_json::to_value(crd).unwrap();
    let spec = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties";
    for field in [
        format!("{spec}/serviceAccountName"),
        format!("{spec}/chart/properties/name"),
        format!("{spec}/chart/properties/oci"),
    ] {
        let property = crd.pointer_mut(&field).expect("the field's schema");
        let property = property.as_object_mut().unwrap();
        for keyword in ["pattern", "minLength", "maxLength"] {
            property.remove(keyword);
        }
    }
    let crd: CustomResourceDefinition = serde_json::from_value(crd).unwrap();
    crds.replace(
        "sequencedreleases.sequenced.dev",
        &PostParams::default(),
        &crd,
    )
    .await
    .expect("replace the CRD");
}

/// What the API server answered a create of `object` as the cluster admin (Err: its message).
async fn create(op: &Operator, namespace: &str, object: Value) -> Result<(), String> {
    let api: Api<SequencedRelease> = Api::namespaced(op.client.clone(), namespace);
    let sr: SequencedRelease = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &sr)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The controller's own writes that are not its books.
fn not_books(op: &Operator) -> Vec<String> {
    tenants::beyond_books(op, "test-controller", OPERATOR_ACCOUNT)
}

// 1. `spec.serviceAccountName: ""` escaped impersonation: the release acted as the controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_service_account_name_is_refused_and_never_acts_as_the_controller() {
    within(async {
        // The chart writes a Secret into another namespace: as the controller, it could.
        let dir = chart(
            "app",
            &[
                ("templates/settings.yaml", &config_map("settings", "helm.sh/layer: config")),
                (
                    "templates/planted.yaml",
                    "apiVersion: v1\nkind: Secret\nmetadata:\n  name: planted\n  namespace: victim\nstringData:\n  token: x\n",
                ),
            ],
        );
        let op = lockdown(&[dir.path()], |_| {}).await;
        tenants::tenant(&op, TEAM_A, team_rules()).await;
        op.namespace("victim").await;
        let empty = release(
            "app",
            &dir.path().join("app"),
            json!({"serviceAccountName": ""}),
        );
        // Admission refuses it now...
        let refused = create(&op, TEAM_A, empty.clone()).await.unwrap_err();
        assert!(refused.contains("serviceAccountName"), "{refused}");
        // ...and one admitted before the CRD said so is stalled, nothing of its chart written.
        admit_as_before(&op).await;
        create(&op, TEAM_A, empty).await.expect("admitted as before");
        let sr = stalled_with(&op, TEAM_A, "app", "InvalidSpec").await;
        assert!(
            message(&sr).contains("spec.serviceAccountName: must not be empty"),
            "{}",
            message(&sr)
        );
        let secrets: Api<Secret> = Api::namespaced(op.client.clone(), "victim");
        assert!(secrets.get_opt("planted").await.unwrap().is_none());
        let configmaps: Api<ConfigMap> = Api::namespaced(op.client.clone(), TEAM_A);
        assert!(configmaps.get_opt("settings").await.unwrap().is_none());
        assert_eq!(not_books(&op), Vec::<String>::new());
        // Deleting it deletes nothing as the controller either.
        op.releases(TEAM_A)
            .delete("app", &DeleteParams::default())
            .await
            .unwrap();
        op.wait_deleted(TEAM_A, "app").await;
        assert_eq!(not_books(&op), Vec::<String>::new());
        op.stop().await;
    })
    .await;
}

/// A chart repository on loopback holding chart `private` 1.0.0 (a ConfigMap `private`), which
/// answers only with the basic credentials `ci:PASSWORD`.
fn private_repository(password: &'static str) -> (TempDir, Server) {
    let repo = TempDir::new().unwrap();
    let source = TempDir::new().unwrap();
    support::chart(source.path(), "private", "1.0.0", "");
    support::package(source.path(), repo.path());
    let status = std::process::Command::new(support::helm())
        .args(["repo", "index"])
        .arg(repo.path())
        .status()
        .unwrap();
    assert!(status.success());
    let server = serve_dir(repo.path(), Some(password));
    (repo, server)
}

fn private_release(server: &Server, credentials: Option<&str>) -> Value {
    let mut chart = json!({"repository": server.url(), "name": "private", "version": "1.0.0"});
    if let Some(name) = credentials {
        chart["credentialsSecretRef"] = json!({"name": name});
    }
    json!({
        "apiVersion": "sequenced.dev/v1alpha1",
        "kind": "SequencedRelease",
        "metadata": {"name": "app"},
        "spec": {"chart": chart}
    })
}

async fn credentials(op: &Operator, namespace: &str, name: &str, password: &str) {
    admin_apply(
        op,
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": name, "namespace": namespace},
               "stringData": {"username": "ci", "password": password}}),
    )
    .await;
}

// 2. The chart cache was shared by every tenant: team B got team A's private chart by naming it,
//    or by pointing `chart.path` at the cache file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_namespace_never_gets_a_private_chart_from_the_cache() {
    within(async {
        let (_repo, server) = private_repository("s3cret");
        let op = lockdown(&[], |_| {}).await;
        tenants::tenant(&op, TEAM_A, team_rules()).await;
        tenants::tenant(&op, TEAM_B, team_rules()).await;
        credentials(&op, TEAM_A, "repo", "s3cret").await;
        create(&op, TEAM_A, private_release(&server, Some("repo")))
            .await
            .unwrap();
        op.wait_release(TEAM_A, "app", "Ready", is_ready).await;
        let cached: Vec<PathBuf> = walk(op.cache_dir().unwrap())
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "tgz"))
            .collect();
        assert_eq!(cached.len(), 1, "{cached:?}");
        // The same repository, name and version, without credentials: not served from the cache.
        create(&op, TEAM_B, private_release(&server, None))
            .await
            .unwrap();
        let said = failing_with(&op, TEAM_B, "app", "HTTP 401 Unauthorized").await;
        assert!(
            said.contains(&format!("chart repository {}", server.url())),
            "{said}"
        );
        // With wrong credentials: neither.
        credentials(&op, TEAM_B, "repo", "guess").await;
        op.releases(TEAM_B)
            .patch(
                "app",
                &PatchParams::default(),
                &Patch::Merge(
                    &json!({"spec": {"chart": {"credentialsSecretRef": {"name": "repo"}}}}),
                ),
            )
            .await
            .unwrap();
        // The repository is asked with them (a fetch of its own, not the cache's answer), and
        // refuses them.
        let guessed = {
            use base64::Engine;
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("ci:guess")
            )
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !server
            .requests()
            .iter()
            .any(|r| r.headers.get("authorization") == Some(&guessed))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "never fetched with B's credentials"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        failing_with(&op, TEAM_B, "app", "HTTP 401 Unauthorized").await;
        // Nor by pointing at the cache file.
        let by_path = release("by-path", &cached[0], json!({}));
        create(&op, TEAM_B, by_path).await.unwrap();
        let sr = stalled_with(&op, TEAM_B, "by-path", "InvalidSpec").await;
        assert!(
            message(&sr).contains("--allow-local-charts"),
            "{}",
            message(&sr)
        );
        let configmaps: Api<ConfigMap> = Api::namespaced(op.client.clone(), TEAM_B);
        let names: Vec<String> = configmaps
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .filter(|n| n.contains("private"))
            .collect();
        assert_eq!(names, Vec::<String>::new(), "team B got team A's chart");
        op.stop().await;
    })
    .await;
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

// 3. `chart.name` was not validated: `../<other-source>/app` read another source's archive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_names_and_oci_references_that_are_paths_are_refused() {
    within(async {
        let op = lockdown(&[], |_| {}).await;
        tenants::tenant(&op, TEAM_A, team_rules()).await;
        let by_name = |name: &str| {
            json!({"apiVersion": "sequenced.dev/v1alpha1", "kind": "SequencedRelease",
                   "metadata": {"name": "by-name"},
                   "spec": {"chart": {"repository": "http://127.0.0.1:9/", "name": name, "version": "1.0.0"}}})
        };
        let by_oci = json!({"apiVersion": "sequenced.dev/v1alpha1", "kind": "SequencedRelease",
                            "metadata": {"name": "by-oci"},
                            "spec": {"chart": {"oci": "oci://127.0.0.1:9/charts/../0123abcd/app", "version": "1.0.0"}}});
        let refused = create(&op, TEAM_A, by_name("../0123abcd/app")).await.unwrap_err();
        assert!(refused.contains("spec.chart.name"), "{refused}");
        let refused = create(&op, TEAM_A, by_oci.clone()).await.unwrap_err();
        assert!(refused.contains("spec.chart.oci"), "{refused}");
        // Admitted before the CRD checked them: stalled, nothing fetched.
        admit_as_before(&op).await;
        create(&op, TEAM_A, by_name("../0123abcd/app")).await.unwrap();
        create(&op, TEAM_A, by_oci).await.unwrap();
        let sr = stalled_with(&op, TEAM_A, "by-name", "InvalidSpec").await;
        assert!(message(&sr).contains("is not a chart name"), "{}", message(&sr));
        let sr = stalled_with(&op, TEAM_A, "by-oci", "InvalidSpec").await;
        assert!(message(&sr).contains("is not an OCI reference"), "{}", message(&sr));
        op.stop().await;
    })
    .await;
}

// 4. One tenant could starve or crash the operator for all: output without end, helm timeouts
//    retried for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chart_that_renders_without_end_is_stopped_and_the_others_are_served() {
    within(async {
        // About 4 MB of YAML from a 200-byte template.
        let endless = chart(
            "endless",
            &[(
                "templates/big.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n{{- range until 100000 }}\n  k{{ . }}: \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"\n{{- end }}\n",
            )],
        );
        let fine = chart(
            "fine",
            &[("templates/settings.yaml", &config_map("settings", "helm.sh/layer: config"))],
        );
        let op = lockdown(&[endless.path(), fine.path()], |options| {
            options.helm = options.helm.clone().with_output_limit(1 << 20);
        })
        .await;
        tenants::tenant(&op, TEAM_A, team_rules()).await;
        tenants::tenant(&op, TEAM_B, team_rules()).await;
        op.create(TEAM_A, release("app", &endless.path().join("endless"), json!({})))
            .await;
        op.create(TEAM_B, release("app", &fine.path().join("fine"), json!({})))
            .await;
        let sr = stalled_with(&op, TEAM_A, "app", "RenderTooLarge").await;
        assert!(
            message(&sr).contains("printed more than 1Mi and was stopped"),
            "{}",
            message(&sr)
        );
        op.wait_release(TEAM_B, "app", "Ready", is_ready).await;
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_render_that_times_out_again_and_again_stalls_instead_of_retrying_for_ever() {
    within(async {
        // A render that takes far longer than its (test) deadline and prints nothing.
        let slow = chart(
            "slow",
            &[(
                "templates/slow.yaml",
                "{{- range until 500000000 }}{{- end }}\n",
            )],
        );
        let op = lockdown(&[slow.path()], |options| {
            options.helm = options.helm.clone().with_timeouts(Timeouts {
                template: Duration::from_secs(1),
                ..Timeouts::default()
            });
        })
        .await;
        tenants::tenant(&op, TEAM_A, team_rules()).await;
        op.create(TEAM_A, release("app", &slow.path().join("slow"), json!({})))
            .await;
        let sr = stalled_with(&op, TEAM_A, "app", "RenderTimeout").await;
        assert!(
            message(&sr).contains("helm template did not finish in time 3 times in a row"),
            "{}",
            message(&sr)
        );
        op.stop().await;
    })
    .await;
}

// 5. Secrets leaked: `targetPath` values on helm's command line and its parse errors in status;
//    tenant inputs and hook logs read with the controller's rights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_path_values_never_reach_helms_command_line_or_any_status() {
    within(async {
        let scratch = TempDir::new().unwrap();
        let (helm, log) = support::recording_helm(scratch.path());
        let dir = chart(
            "app",
            &[(
                "templates/settings.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  password: {{ .Values.db.password | quote }}\n  port: {{ .Values.db.port | toString | quote }}\n",
            )],
        );
        let op = lockdown(&[dir.path()], move |options| options.helm = helm).await;
        tenants::tenant(&op, TEAM_A, team_rules()).await;
        // What `--set` would split at its commas, read as a list, and fail on, naming it.
        let password = "p@ss,w{o}rd=x\\y'z";
        admin_apply(
            &op,
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "db", "namespace": TEAM_A},
                   "stringData": {"password": password, "port": "5432"}}),
        )
        .await;
        op.create(
            TEAM_A,
            release(
                "app",
                &dir.path().join("app"),
                json!({"valuesFrom": [
                    {"kind": "Secret", "name": "db", "valuesKey": "password", "targetPath": "db.password"},
                    {"kind": "Secret", "name": "db", "valuesKey": "port", "targetPath": "db.port"}
                ]}),
            ),
        )
        .await;
        op.wait_release(TEAM_A, "app", "Ready", is_ready).await;
        let settings: ConfigMap = Api::namespaced(op.client.clone(), TEAM_A)
            .get("settings")
            .await
            .unwrap();
        let data = settings.data.unwrap();
        assert_eq!(data["password"], password);
        assert_eq!(data["port"], "5432");
        let argv = std::fs::read_to_string(&log).unwrap();
        assert!(argv.contains("ARGS template"), "{argv}");
        assert!(!argv.contains("p@ss"), "a value on helm's command line:\n{argv}");
        // A path helm cannot set is refused naming the path, never the value.
        op.releases(TEAM_A)
            .patch(
                "app",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"valuesFrom": [
                    {"kind": "Secret", "name": "db", "valuesKey": "password", "targetPath": "a..b"}
                ]}})),
            )
            .await
            .unwrap();
        let sr = stalled_with(&op, TEAM_A, "app", "InvalidSpec").await;
        assert!(message(&sr).contains("cannot set values path a..b"), "{}", message(&sr));
        let seen = readable(&op, TEAM_A, "app").await;
        assert!(!seen.contains("p@ss"), "{seen}");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_path_values_are_typed_as_helms_set_types_a_scalar() {
    // The oracle: helm's own `--set` on values it reads as one scalar.
    let dir = chart("values", &[("templates/v.yaml", "{{ toJson .Values }}\n")]);
    for value in [
        "true",
        "TRUE",
        "False",
        "null",
        "Null",
        "0",
        "007",
        "42",
        "-3",
        "+5",
        "1.5",
        "1e3",
        "9223372036854775807",
        "9223372036854775808",
        "text",
        "\"quoted\"",
        "'7'",
        "a b",
    ] {
        let output = std::process::Command::new(support::helm())
            .args(["template", "v"])
            .arg(dir.path().join("values"))
            .args(["--set", &format!("x={value}")])
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&output.stdout);
        let json = printed
            .lines()
            .filter(|l| !l.starts_with("---") && !l.starts_with("# Source"))
            .collect::<String>();
        let helm_value: Value = serde_json::from_str::<Value>(&json).unwrap()["x"].clone();
        // Quoted values are strings without their quotes (Flux's reading, helm's --set-string).
        let want = match value
            .strip_prefix(['"', '\''])
            .and_then(|v| v.strip_suffix(['"', '\'']))
        {
            Some(inner) => Value::String(inner.to_string()),
            None => helm_value,
        };
        assert_eq!(sequenced::pipeline::typed(value), want, "{value}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_and_hook_logs_are_read_as_the_releases_account() {
    within(async {
        let failing = format!(
            "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\n  labels:\n    {}: fail\n  annotations:\n    helm.sh/hook: pre-install\nspec:\n  backoffLimit: 0\n  template:\n    metadata:\n      annotations:\n        {}: \"SECRET-LOG-LINE\\n\"\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: main\n          image: busybox:1.36\n",
            support::workloads::OUTCOME_LABEL,
            support::workloads::LOG_ANNOTATION,
        );
        let hooked = chart("hooked", &[("templates/migrate.yaml", failing.as_str())]);
        let plain = chart(
            "plain",
            &[("templates/settings.yaml", &config_map("settings", "helm.sh/layer: config"))],
        );
        let op = lockdown(&[hooked.path(), plain.path()], |_| {}).await;
        let _jobs = op.job_controller(Duration::from_millis(50));
        // Team A may run Jobs and read its Pods, but not their logs.
        let mut rules = team_rules();
        rules.as_array_mut().unwrap().extend([
            json!({"apiGroups": ["batch"], "resources": ["jobs"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}),
            json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}),
        ]);
        tenants::tenant(&op, TEAM_A, rules).await;
        op.create(TEAM_A, release("app", &hooked.path().join("hooked"), json!({})))
            .await;
        let sr = stalled_with(&op, TEAM_A, "app", "HookFailed").await;
        let said = message(&sr);
        assert!(
            said.contains("could not be read: serviceaccount team-a:deployer may not get pods/log"),
            "{said}"
        );
        let seen = readable(&op, TEAM_A, "app").await;
        assert!(!seen.contains("SECRET-LOG-LINE"), "{seen}");
        // Team B's account may not read the Secret its release names: Forbidden, naming it.
        tenants::tenant(&op, TEAM_B, tenants::config_map_rules()).await;
        admin_apply(
            &op,
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "db", "namespace": TEAM_B},
                   "stringData": {"values.yaml": "x: SECRET-VALUE\n"}}),
        )
        .await;
        op.create(
            TEAM_B,
            release(
                "app",
                &plain.path().join("plain"),
                json!({"valuesFrom": [{"kind": "Secret", "name": "db"}]}),
            ),
        )
        .await;
        let sr = stalled_with(&op, TEAM_B, "app", "Forbidden").await;
        assert!(
            message(&sr).contains("serviceaccount team-b:deployer cannot get secrets \"db\""),
            "{}",
            message(&sr)
        );
        let configmaps: Api<ConfigMap> = Api::namespaced(op.client.clone(), TEAM_B);
        assert!(configmaps.get_opt("settings").await.unwrap().is_none());
        op.stop().await;
    })
    .await;
}

// 6. Any URL was fetched from the operator's pod, and helm's error told what answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_sources_on_internal_addresses_are_refused_and_what_answered_is_never_told() {
    within(async {
        // A repository whose index sends the download to the cloud's metadata service.
        let redirecting = Server::start(|request| match request.path.as_str() {
            "/index.yaml" => Response::ok(
                "text/yaml",
                "apiVersion: v1\nentries:\n  app:\n  - name: app\n    version: 1.0.0\n    urls: [http://169.254.169.254/latest/meta-data/app-1.0.0.tgz]\n",
            ),
            _ => Response::not_found(),
        });
        // A service that answers something that is not an index, with what a tenant may not read.
        let talkative = Server::start(|_| {
            Response::ok("text/yaml", "ami-id: SECRET-TOKEN-123\ninstance-id: i-0abc\n")
        });
        let op = lockdown(&[], |_| {}).await;
        tenants::tenant(&op, TEAM_A, team_rules()).await;
        let from = |name: &str, url: &str| {
            json!({"apiVersion": "sequenced.dev/v1alpha1", "kind": "SequencedRelease",
                   "metadata": {"name": name},
                   "spec": {"chart": {"repository": url, "name": "app", "version": "1.0.0"}}})
        };
        create(&op, TEAM_A, from("metadata", "http://169.254.169.254/charts")).await.unwrap();
        create(&op, TEAM_A, from("redirected", &redirecting.url())).await.unwrap();
        create(&op, TEAM_A, from("talkative", &talkative.url())).await.unwrap();
        for name in ["metadata", "redirected"] {
            let sr = stalled_with(&op, TEAM_A, name, "SourceNotAllowed").await;
            let said = message(&sr);
            // Only the test's repositories (loopback) are allowed here; without an allow-list,
            // multi-tenant mode refuses every address that is not public (src/chart/egress.rs).
            assert!(
                said.contains("169.254.169.254 is not an allowed chart source")
                    && said.contains("is in --chart-source-allow"),
                "{name}: {said}"
            );
        }
        let said = failing_with(&op, TEAM_A, "talkative", "is not a chart repository").await;
        assert!(said.contains(&format!("chart repository {}", talkative.url())), "{said}");
        let seen = readable(&op, TEAM_A, "talkative").await;
        assert!(
            !seen.contains("ami-id") && !seen.contains("SECRET-TOKEN"),
            "what the source answered is told: {seen}"
        );
        op.stop().await;
    })
    .await;
}

// 7. An uninstall whose record was missing orphaned the namespaced objects silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uninstall_without_its_record_removes_what_the_owner_annotation_finds() {
    within(async {
        let dir = chart(
            "app",
            &[
                (
                    "templates/settings.yaml",
                    &config_map("settings", "helm.sh/layer: config"),
                ),
                (
                    "templates/more.yaml",
                    &config_map(
                        "more",
                        "helm.sh/layer: more\n    helm.sh/depends-on/layers: config",
                    ),
                ),
            ],
        );
        let mut op = lockdown(&[dir.path()], |_| {}).await;
        tenants::tenant(&op, TEAM_A, team_rules()).await;
        // An unrelated ConfigMap of the same label but another owner stays.
        admin_apply(
            &op,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "other", "namespace": TEAM_A,
                                "labels": {"app.kubernetes.io/managed-by": "sequenced"},
                                "annotations": {"sequenced.dev/owner": "team-a/other"}}}),
        )
        .await;
        op.create(TEAM_A, release("app", &dir.path().join("app"), json!({})))
            .await;
        op.wait_release(TEAM_A, "app", "Ready", is_ready).await;
        // The record is deleted by hand while the operator is down (a controller that read it
        // before keeps it in memory, and uninstalls by it).
        op.take_controller().stop().await;
        let secrets: Api<Secret> = Api::namespaced(op.client.clone(), TEAM_A);
        secrets
            .delete("sh.helm.release.v1.app.v1", &DeleteParams::default())
            .await
            .unwrap();
        // While the account may create ConfigMaps but not list them, they cannot all be found:
        // the uninstall waits and says why.
        admin_apply(
            &op,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": DEPLOYER, "namespace": TEAM_A},
                   "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                              "verbs": ["get", "create", "patch", "delete"]},
                             {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}),
        )
        .await;
        op.releases(TEAM_A)
            .delete("app", &DeleteParams::default())
            .await
            .unwrap();
        let restarted = controller(&op, &[dir.path()], |_| {});
        op.adopt(restarted);
        let sr = stalled_with(&op, TEAM_A, "app", "RecordMissing").await;
        let said = message(&sr);
        assert!(
            said.contains("the record of revision 1 is missing")
                && said
                    .contains("serviceaccount team-a:deployer may create but not list configmaps"),
            "{said}"
        );
        let configmaps: Api<ConfigMap> = Api::namespaced(op.client.clone(), TEAM_A);
        assert!(configmaps.get_opt("settings").await.unwrap().is_some());
        // Given list back, the uninstall finds both objects, deletes them and says so.
        admin_apply(
            &op,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": DEPLOYER, "namespace": TEAM_A},
                   "rules": team_rules()}),
        )
        .await;
        // Nothing watches RBAC: as a user does after granting a right, ask for a reconcile
        // (`sequenced reconcile`) instead of waiting for the stalled release's 60 s retry.
        let requested = sequenced::api::names::RECONCILE_REQUEST_ANNOTATION;
        Api::<SequencedRelease>::namespaced(op.client.clone(), TEAM_A)
            .patch(
                "app",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {requested: "after-the-role"}}})),
            )
            .await
            .unwrap();
        op.wait_deleted(TEAM_A, "app").await;
        for name in ["settings", "more"] {
            assert!(
                configmaps.get_opt(name).await.unwrap().is_none(),
                "{name} orphaned"
            );
        }
        assert!(configmaps.get_opt("other").await.unwrap().is_some());
        let note = op.wait_event(TEAM_A, "app", "RecordMissing").await;
        assert!(
            note.contains("uninstalling the 2 objects found by their owner annotation"),
            "{note}"
        );
        op.stop().await;
    })
    .await;
}

// The operator chart's own rights: what the controller wrote as itself in every scenario above
// is its books; here a whole install, upgrade and uninstall as a tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_writes_only_its_books_as_itself() {
    within(async {
        let dir = chart(
            "app",
            &[(
                "templates/settings.yaml",
                &config_map("settings", "helm.sh/layer: config"),
            )],
        );
        let op = lockdown(&[dir.path()], |_| {}).await;
        tenants::tenant(&op, TEAM_A, team_rules()).await;
        op.create(TEAM_A, release("app", &dir.path().join("app"), json!({})))
            .await;
        op.wait_release(TEAM_A, "app", "Ready", is_ready).await;
        op.releases(TEAM_A)
            .patch(
                "app",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"values": {"v": 2}}})),
            )
            .await
            .unwrap();
        op.wait_release(TEAM_A, "app", "revision 2 Ready", |sr| {
            is_ready(sr) && sr.status.as_ref().and_then(|s| s.revision) == Some(2)
        })
        .await;
        op.releases(TEAM_A)
            .delete("app", &DeleteParams::default())
            .await
            .unwrap();
        op.wait_deleted(TEAM_A, "app").await;
        let refused = tenants::refused(&op, "test-controller");
        assert_eq!(refused, Vec::<String>::new(), "refused requests");
        assert_eq!(not_books(&op), Vec::<String>::new());
        op.stop().await;
    })
    .await;
}
