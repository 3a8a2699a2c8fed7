//! The operator's own install: the chart in charts/sequenced, the plain manifests in deploy/
//! generated from it, and the Dockerfile that builds the image they run.

use sequenced_testkit as support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

const NAMESPACE: &str = "sequenced-system";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn helm(args: &[&str]) -> Output {
    Command::new(support::helm())
        .args(args)
        .current_dir(root())
        .output()
        .expect("run helm (is helm installed? scripts/install-helm.sh)")
}

/// `helm template sequenced charts/sequenced --namespace sequenced-system ARGS`, parsed.
fn render(args: &[&str]) -> Vec<Value> {
    let mut all = vec![
        "template",
        "sequenced",
        "charts/sequenced",
        "--namespace",
        NAMESPACE,
    ];
    all.extend_from_slice(args);
    let output = helm(&all);
    assert!(
        output.status.success(),
        "helm {all:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    documents(&String::from_utf8_lossy(&output.stdout))
}

/// What helm says when it refuses to render the chart with `args`.
fn render_error(args: &[&str]) -> String {
    let mut all = vec!["template", "sequenced", "charts/sequenced"];
    all.extend_from_slice(args);
    let output = helm(&all);
    assert!(
        !output.status.success(),
        "helm {all:?} rendered, expected a refusal"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn documents(text: &str) -> Vec<Value> {
    sequenced::yaml::parse_documents(text)
        .expect("the rendered chart is YAML")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// Every option of the chart switched on or away from its default.
const EVERYTHING_ON: &str = r#"
replicas: 3
concurrency: 4
logLevel: info,sequenced=debug
image:
  repository: registry.example.com/platform/sequenced
  tag: dev
  pullPolicy: Always
imagePullSecrets: [{name: registry}]
extraEnv: [{name: HTTPS_PROXY, value: "http://proxy:3128"}]
serviceAccount:
  name: operator
  annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::1:role/sequenced"}
rbac:
  manageEverything: false
  rules:
    - apiGroups: ["", "apps"]
      resources: ["services", "configmaps", "deployments"]
      verbs: ["get", "list", "watch", "create", "patch", "delete"]
  releaseNamespaces: [team-a, team-b]
podAnnotations: {example.com/scrape: "false"}
podLabels: {team: platform}
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: ops, effect: NoSchedule}]
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector: {matchLabels: {app.kubernetes.io/name: sequenced}}
priorityClassName: system-cluster-critical
terminationGracePeriodSeconds: 45
tmp: {sizeLimit: 2Gi}
metrics:
  serviceMonitor:
    enabled: true
    labels: {release: kube-prometheus-stack}
    interval: 15s
    scrapeTimeout: 10s
grafana:
  dashboard:
    enabled: true
    annotations: {grafana_folder: Operators}
    namespace: monitoring
"#;

fn everything_on_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("values.yaml");
    std::fs::write(&path, EVERYTHING_ON).expect("write values");
    (dir, path)
}

fn render_everything_on() -> Vec<Value> {
    let (_dir, values) = everything_on_file();
    render(&["--values", values.to_str().expect("UTF-8 temp path")])
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| {
            let present: Vec<String> = docs
                .iter()
                .map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"]))
                .collect();
            panic!("no {kind} {name} among {present:?}")
        })
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn container(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

fn env(container: &Value, name: &str) -> Value {
    container["env"]
        .as_array()
        .expect("env is a list")
        .iter()
        .find(|e| e["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no env {name} in {}", container["env"]))
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// RBAC as the API server evaluates it

fn rule_allows(rule: &Value, group: &str, resource: &str, verb: &str) -> bool {
    let has = |field: &str, wanted: &str| {
        strings(&rule[field])
            .iter()
            .any(|v| *v == "*" || *v == wanted)
    };
    has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
}

/// The rules the controller's service account holds in `namespace` (None: cluster-wide only),
/// following the bindings that name it to the roles they grant.
fn granted(docs: &[Value], account: (&str, &str), namespace: Option<&str>) -> Vec<Value> {
    let names_account = |binding: &Value| {
        binding["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == account.0
                    && s["namespace"] == account.1
            })
    };
    let mut rules = Vec::new();
    for binding in docs {
        let applies = match binding["kind"].as_str() {
            Some("ClusterRoleBinding") => true,
            Some("RoleBinding") => {
                namespace.is_some() && binding["metadata"]["namespace"].as_str() == namespace
            }
            _ => false,
        };
        if !applies || !names_account(binding) {
            continue;
        }
        let role_ref = &binding["roleRef"];
        let role = docs.iter().find(|d| {
            d["kind"] == role_ref["kind"]
                && d["metadata"]["name"] == role_ref["name"]
                && (d["kind"] == "ClusterRole"
                    || d["metadata"]["namespace"] == binding["metadata"]["namespace"])
        });
        let role = role.unwrap_or_else(|| panic!("{binding} binds a role the chart lacks"));
        rules.extend(role["rules"].as_array().into_iter().flatten().cloned());
    }
    rules
}

fn allows(rules: &[Value], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|r| rule_allows(r, group, resource, verb))
}

/// What `sequenced run` does through the API in a release's namespace.
const CONTROLLER_NEEDS: &[(&str, &str, &[&str])] = &[
    (
        "sequenced.dev",
        "sequencedreleases",
        &["get", "list", "watch", "update", "patch"],
    ),
    (
        "sequenced.dev",
        "sequencedreleases/status",
        &["update", "patch"],
    ),
    ("sequenced.dev", "sequencedreleases/finalizers", &["update"]),
    ("", "configmaps", &["get"]),
    ("", "secrets", &["get", "create", "patch", "delete"]),
    ("", "namespaces", &["get", "create"]),
    ("events.k8s.io", "events", &["create", "patch"]),
    (
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update", "delete"],
    ),
];

fn missing_needs(rules: &[Value]) -> Vec<String> {
    let mut missing = Vec::new();
    for (group, resource, verbs) in CONTROLLER_NEEDS {
        for verb in *verbs {
            if !allows(rules, group, resource, verb) {
                missing.push(format!("{verb} {resource}.{group}"));
            }
        }
    }
    missing
}

/// The service account the Deployment runs as, with its namespace.
fn pod_account(docs: &[Value]) -> (String, String) {
    let deployment = of_kind(docs, "Deployment")[0];
    let name = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("the pod names its service account")
        .to_string();
    let account = find(docs, "ServiceAccount", &name);
    (
        name,
        account["metadata"]["namespace"]
            .as_str()
            .expect("namespaced")
            .to_string(),
    )
}

// ---------------------------------------------------------------------------------------------
// The chart

#[test]
fn helm_lint_strict_passes_with_default_values_and_with_every_option_on() {
    let output = helm(&["lint", "--strict", "charts/sequenced"]);
    assert!(
        output.status.success(),
        "helm lint --strict charts/sequenced:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let (_dir, values) = everything_on_file();
    let output = helm(&[
        "lint",
        "--strict",
        "charts/sequenced",
        "--values",
        values.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "helm lint --strict with every option on:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn default_values_install_the_controller_and_nothing_optional() {
    let docs = render(&[]);
    let mut kinds: Vec<String> = docs
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap(),
                d["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole/sequenced-controller",
            "ClusterRole/sequenced-manage",
            "ClusterRole/sequenced-release-namespace",
            "ClusterRoleBinding/sequenced-controller",
            "ClusterRoleBinding/sequenced-manage",
            "ClusterRoleBinding/sequenced-release-namespace",
            "Deployment/sequenced",
            "Role/sequenced-shards",
            "RoleBinding/sequenced-shards",
            "Service/sequenced-metrics",
            "ServiceAccount/sequenced",
        ]
    );
    for doc in &docs {
        let labels = &doc["metadata"]["labels"];
        for label in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ] {
            assert!(
                labels[label].is_string(),
                "{} {} lacks the label {label}",
                doc["kind"],
                doc["metadata"]["name"]
            );
        }
        if !doc["kind"].as_str().unwrap().starts_with("Cluster") {
            assert_eq!(
                doc["metadata"]["namespace"], NAMESPACE,
                "{} {} is not in the release namespace",
                doc["kind"], doc["metadata"]["name"]
            );
        }
    }
}

#[test]
fn the_pod_meets_the_restricted_pod_security_standard() {
    let docs = render(&[]);
    let deployment = find(&docs, "Deployment", "sequenced");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let security = &container(deployment)["securityContext"];
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["runAsUser"], 65532);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
}

#[test]
fn everything_the_controller_writes_is_on_the_tmp_empty_dir() {
    let docs = render(&[]);
    let deployment = find(&docs, "Deployment", "sequenced");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = container(deployment);
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/tmp")
        .expect("/tmp is mounted");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the /tmp volume exists");
    assert!(
        volume["emptyDir"].is_object(),
        "/tmp is not an emptyDir: {volume}"
    );
    for name in [
        "SEQUENCED_CACHE_DIR",
        "HELM_CACHE_HOME",
        "HELM_CONFIG_HOME",
        "HELM_DATA_HOME",
    ] {
        let value = env(container, name)["value"].as_str().unwrap().to_string();
        assert!(
            value.starts_with("/tmp/"),
            "{name}={value} is on the read-only root file system"
        );
    }
}

#[test]
fn the_controller_runs_with_its_flags_identity_probes_and_resources() {
    let docs = render(&[]);
    let deployment = find(&docs, "Deployment", "sequenced");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = container(deployment);
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(container["image"], "sequenced:0.1.0");
    assert_eq!(
        container["args"],
        json!(["run", "--metrics-addr=0.0.0.0:8080", "--concurrency=16"])
    );
    assert_eq!(
        env(container, "SEQUENCED_IDENTITY")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(env(container, "RUST_LOG")["value"], "info");
    assert_eq!(
        container["ports"],
        json!([{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}])
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(
            container[probe]["httpGet"],
            json!({"path": path, "port": "metrics"}),
            "{probe}"
        );
    }
    for bound in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                container["resources"][bound][resource].is_string(),
                "no {bound}.{resource}: {}",
                container["resources"]
            );
        }
    }
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
    // The pods are selected by labels that stay the same across upgrades.
    let selector = &deployment["spec"]["selector"]["matchLabels"];
    assert_eq!(
        selector,
        &json!({"app.kubernetes.io/name": "sequenced", "app.kubernetes.io/instance": "sequenced"})
    );
    for (key, value) in selector.as_object().unwrap() {
        assert_eq!(
            &deployment["spec"]["template"]["metadata"]["labels"][key],
            value
        );
    }
}

#[test]
fn the_metrics_service_reaches_the_pods_metrics_port() {
    let docs = render(&[]);
    let service = find(&docs, "Service", "sequenced-metrics");
    let deployment = find(&docs, "Deployment", "sequenced");
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}])
    );
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod_labels[key], value, "the Service selects {key}={value}");
    }
}

#[test]
fn default_rbac_covers_the_controller_and_everything_a_chart_may_contain() {
    let docs = render(&[]);
    let (name, namespace) = pod_account(&docs);
    let rules = granted(&docs, (&name, &namespace), None);
    assert_eq!(missing_needs(&rules), Vec::<String>::new());
    for (group, resource) in [
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("apps", "deployments"),
        ("rbac.authorization.k8s.io", "clusterroles"),
        ("", "namespaces"),
        ("example.com", "widgets"),
    ] {
        for verb in ["get", "list", "watch", "create", "patch", "delete"] {
            assert!(
                allows(&rules, group, resource, verb),
                "cannot {verb} {resource}.{group}"
            );
        }
    }
}

#[test]
fn custom_rbac_keeps_the_controllers_own_rights_and_grants_only_the_listed_contents() {
    let docs = render_everything_on();
    let (name, namespace) = pod_account(&docs);
    assert_eq!((name.as_str(), namespace.as_str()), ("operator", NAMESPACE));
    let cluster_wide = granted(&docs, (&name, &namespace), None);
    assert!(
        !cluster_wide
            .iter()
            .any(|r| strings(&r["verbs"]).contains(&"*")),
        "manageEverything: false still grants every verb: {cluster_wide:?}"
    );
    assert!(allows(&cluster_wide, "apps", "deployments", "create"));
    assert!(!allows(&cluster_wide, "apps", "statefulsets", "create"));
    assert!(!allows(
        &cluster_wide,
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "create"
    ));
    // Releases in the listed namespaces: everything the controller needs.
    for team in ["team-a", "team-b"] {
        let rules = granted(&docs, (&name, &namespace), Some(team));
        assert_eq!(missing_needs(&rules), Vec::<String>::new(), "in {team}");
    }
    // Elsewhere it may read releases but not lock them or write records.
    assert!(allows(
        &cluster_wide,
        "sequenced.dev",
        "sequencedreleases",
        "watch"
    ));
    assert!(!allows(
        &cluster_wide,
        "coordination.k8s.io",
        "leases",
        "create"
    ));
    assert!(!allows(&cluster_wide, "", "secrets", "create"));
}

#[test]
fn multi_tenant_rbac_grants_the_controller_its_bookkeeping_and_impersonation_only() {
    let docs = render(&["--set", "tenancy.multiTenant=true"]);
    let (name, namespace) = pod_account(&docs);
    let rules = granted(&docs, (&name, &namespace), None);
    // Target namespaces are created as the release's service account.
    let missing: Vec<String> = missing_needs(&rules)
        .into_iter()
        .filter(|m| m != "create namespaces.")
        .collect();
    assert_eq!(missing, Vec::<String>::new());
    assert!(allows(&rules, "", "serviceaccounts", "impersonate"));
    assert!(!allows(&rules, "", "users", "impersonate"));
    assert!(!allows(&rules, "", "groups", "impersonate"));
    assert!(
        !rules.iter().any(|r| strings(&r["verbs"]).contains(&"*")
            || strings(&r["resources"]).contains(&"*")),
        "multi-tenant still grants everything: {rules:?}"
    );
    for (group, resource) in [
        ("apps", "deployments"),
        ("rbac.authorization.k8s.io", "clusterroles"),
        ("", "namespaces"),
        ("", "configmaps"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
    ] {
        assert!(
            !allows(&rules, group, resource, "create"),
            "the controller itself may create {resource}.{group}"
        );
    }
    let deployment = of_kind(&docs, "Deployment")[0];
    let args = strings(&container(deployment)["args"]);
    assert!(
        args.contains(&"--default-service-account=default"),
        "{args:?}"
    );
    assert!(args.contains(&"--no-cross-namespace-refs"), "{args:?}");
    // Each is its own choice too.
    let docs = render(&[
        "--set",
        "tenancy.multiTenant=true",
        "--set",
        "tenancy.noCrossNamespaceRefs=false",
        "--set",
        "tenancy.defaultServiceAccount=deployer",
    ]);
    let args = strings(&container(of_kind(&docs, "Deployment")[0])["args"]);
    assert!(
        args.contains(&"--default-service-account=deployer"),
        "{args:?}"
    );
    assert!(!args.contains(&"--no-cross-namespace-refs"), "{args:?}");
    let default_args =
        strings(&container(of_kind(&render(&[]), "Deployment")[0])["args"]).join(" ");
    assert!(
        !default_args.contains("service-account") && !default_args.contains("cross-namespace"),
        "{default_args}"
    );
}

#[test]
fn custom_rbac_without_rules_is_refused_with_a_hint() {
    let message = render_error(&["--set", "rbac.manageEverything=false"]);
    assert!(
        message.contains("rbac.manageEverything is false and rbac.rules is empty"),
        "{message}"
    );
}

#[test]
fn a_misspelt_value_is_refused_instead_of_ignored() {
    let message = render_error(&["--set", "replicaCount=3"]);
    assert!(message.contains("replicaCount"), "{message}");
    let message = render_error(&["--set", "metrics.serviceMonitor.enable=true"]);
    assert!(message.contains("enable"), "{message}");
}

#[test]
fn every_option_reaches_the_rendered_objects() {
    let docs = render_everything_on();
    let deployment = find(&docs, "Deployment", "sequenced");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = container(deployment);
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(
        container["image"],
        "registry.example.com/platform/sequenced:dev"
    );
    assert_eq!(container["imagePullPolicy"], "Always");
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "registry"}]));
    assert!(strings(&container["args"]).contains(&"--concurrency=4"));
    assert_eq!(env(container, "RUST_LOG")["value"], "info,sequenced=debug");
    assert_eq!(env(container, "HTTPS_PROXY")["value"], "http://proxy:3128");
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["annotations"]["example.com/scrape"],
        "false"
    );
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["labels"]["team"],
        "platform"
    );
    assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert!(pod["affinity"]["podAntiAffinity"].is_object());
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod["terminationGracePeriodSeconds"], 45);
    assert_eq!(pod["volumes"][0]["emptyDir"]["sizeLimit"], "2Gi");
    let account = find(&docs, "ServiceAccount", "operator");
    assert!(account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].is_string());
    // The release namespaces', and the operator's own for the shard Leases.
    let roles = of_kind(&docs, "RoleBinding");
    let role_namespaces: Vec<&Value> = roles.iter().map(|r| &r["metadata"]["namespace"]).collect();
    assert_eq!(
        role_namespaces,
        [&json!("team-a"), &json!("team-b"), &json!(NAMESPACE)]
    );
}

#[test]
fn the_service_monitor_scrapes_the_metrics_service() {
    let docs = render_everything_on();
    let monitor = of_kind(&docs, "ServiceMonitor");
    assert_eq!(monitor.len(), 1, "one ServiceMonitor");
    let monitor = monitor[0];
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(
        monitor["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let selected: Vec<&Value> = of_kind(&docs, "Service")
        .into_iter()
        .filter(|service| {
            monitor["spec"]["selector"]["matchLabels"]
                .as_object()
                .unwrap()
                .iter()
                .all(|(k, v)| &service["metadata"]["labels"][k] == v)
                && strings(&monitor["spec"]["namespaceSelector"]["matchNames"])
                    .contains(&service["metadata"]["namespace"].as_str().unwrap())
        })
        .collect();
    assert_eq!(selected.len(), 1, "the ServiceMonitor selects {selected:?}");
    let service = selected[0];
    assert_eq!(service["metadata"]["name"], "sequenced-metrics");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(endpoint["interval"], "15s");
    assert_eq!(endpoint["scrapeTimeout"], "10s");
}

/// The dashboard's JSON and its ConfigMap, rendered with `args`.
fn dashboard(args: &[&str]) -> (Value, Value) {
    let docs = render(args);
    let config_map = find(&docs, "ConfigMap", "sequenced-dashboard").clone();
    let text = config_map["data"]["sequenced.json"]
        .as_str()
        .expect("the ConfigMap holds sequenced.json");
    let dashboard: Value = serde_json::from_str(text).expect("the dashboard is JSON");
    (config_map, dashboard)
}

#[test]
fn the_dashboard_config_map_carries_the_sidecar_label() {
    let (config_map, _) = dashboard(&["--set", "grafana.dashboard.enabled=true"]);
    assert_eq!(config_map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(config_map["metadata"]["namespace"], NAMESPACE);
    let docs = render_everything_on();
    let config_map = find(&docs, "ConfigMap", "sequenced-dashboard");
    assert_eq!(config_map["metadata"]["namespace"], "monitoring");
    assert_eq!(
        config_map["metadata"]["annotations"]["grafana_folder"],
        "Operators"
    );
    // Another sidecar label instead of the default one.
    let (config_map, _) = dashboard(&[
        "--set",
        "grafana.dashboard.enabled=true",
        "--set",
        "grafana.dashboard.labels.grafana_dashboard=null",
        "--set",
        "grafana.dashboard.labels.dashboards=sequenced",
    ]);
    let labels = &config_map["metadata"]["labels"];
    assert_eq!(labels["dashboards"], "sequenced");
    assert!(labels.get("grafana_dashboard").is_none(), "{labels}");
}

#[test]
fn the_dashboard_plots_every_metric_of_the_design() {
    let (_, dashboard) = dashboard(&["--set", "grafana.dashboard.enabled=true"]);
    let panels = dashboard["panels"].as_array().expect("panels");
    let exprs: Vec<(String, String)> = panels
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_string();
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap_or_default().into()))
        })
        .collect();
    let uses = |needle: &str| exprs.iter().any(|(_, e)| e.contains(needle));
    assert!(uses("sum by (phase) (sequenced_releases)"));
    assert!(uses("sum by (result) (rate(sequenced_reconcile_total["));
    assert!(uses(r#"sequenced_reconcile_total{result="error"}"#));
    for histogram in [
        "sequenced_reconcile_duration_seconds",
        "sequenced_render_duration_seconds",
        "sequenced_layer_apply_duration_seconds",
        "sequenced_layer_wait_duration_seconds",
    ] {
        assert!(
            exprs
                .iter()
                .any(|(_, e)| e.starts_with("histogram_quantile(")
                    && e.contains(&format!("rate({histogram}_bucket["))),
            "no quantile of {histogram}"
        );
    }
    for counter in [
        "sequenced_lock_takeovers_total",
        "sequenced_readiness_timeouts_total",
    ] {
        assert!(
            uses(&format!("increase({counter}[")),
            "no panel of {counter}"
        );
    }
    // Every query goes to the data source the viewer picks, and panels do not overlap ids.
    let variables = &dashboard["templating"]["list"];
    assert!(
        variables
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "datasource" && v["type"] == "datasource")
    );
    let mut ids = Vec::new();
    for panel in panels {
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "{}",
            panel["title"]
        );
        ids.push(panel["id"].as_i64().expect("a panel id"));
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), panels.len(), "duplicate panel ids");
}

#[test]
fn the_install_notes_name_the_objects_the_chart_creates() {
    let output = helm(&[
        "install",
        "sequenced",
        "charts/sequenced",
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let notes = stdout
        .split_once("NOTES:")
        .expect("helm prints the notes")
        .1;
    assert!(notes.contains("kubectl -n sequenced-system rollout status deployment/sequenced"));
    assert!(notes.contains("port-forward service/sequenced-metrics 8080"));
}

// ---------------------------------------------------------------------------------------------
// deploy/

#[test]
fn committed_deploy_manifests_match_the_chart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = Command::new("bash")
        .arg(root().join("scripts/generate-deploy.sh"))
        .arg(dir.path())
        .env("SEQUENCED_HELM", support::helm())
        .output()
        .expect("run scripts/generate-deploy.sh");
    assert!(
        output.status.success(),
        "scripts/generate-deploy.sh failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let generated = std::fs::read_to_string(dir.path().join("sequenced.yaml")).unwrap();
    let committed =
        std::fs::read_to_string(root().join("deploy/sequenced.yaml")).unwrap_or_default();
    assert!(
        generated == committed,
        "deploy/sequenced.yaml differs from what charts/sequenced renders; run \
         scripts/generate-deploy.sh and commit the result"
    );
    // The plain manifests are the chart with its default values, plus their namespace.
    let docs = documents(&generated);
    assert_eq!(docs[0]["kind"], "Namespace");
    assert_eq!(docs[0]["metadata"]["name"], NAMESPACE);
    assert_eq!(&docs[1..], render(&[]).as_slice());
}

#[test]
fn kustomize_builds_the_whole_install_from_deploy() {
    let Ok(kubectl) = which::which("kubectl") else {
        eprintln!("kubectl is not installed: skipping the kubectl kustomize check of deploy/");
        return;
    };
    // Every manifest in deploy/ is listed, so `kubectl apply -k deploy/` installs all of it.
    let kustomization: Value = sequenced::yaml::parse(
        &std::fs::read_to_string(root().join("deploy/kustomization.yaml")).unwrap(),
    )
    .unwrap();
    let mut listed: Vec<&str> = strings(&kustomization["resources"]);
    listed.sort_unstable();
    let mut present: Vec<String> = std::fs::read_dir(root().join("deploy"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    present.sort_unstable();
    assert_eq!(listed, present);

    let output = Command::new(kubectl)
        .args(["kustomize", "deploy/"])
        .current_dir(root())
        .output()
        .expect("run kubectl kustomize");
    assert!(
        output.status.success(),
        "kubectl kustomize deploy/: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let docs = documents(&String::from_utf8_lossy(&output.stdout));
    find(&docs, "Namespace", NAMESPACE);
    find(
        &docs,
        "CustomResourceDefinition",
        "sequencedreleases.sequenced.dev",
    );
    let deployment = find(&docs, "Deployment", "sequenced");
    assert_eq!(deployment["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        container(deployment)["args"],
        json!(["run", "--metrics-addr=0.0.0.0:8080", "--concurrency=16"])
    );
    // kubectl applies these objects, so none of them claims to be managed by Helm.
    for doc in &docs {
        for labels in [
            &doc["metadata"]["labels"],
            &doc["spec"]["template"]["metadata"]["labels"],
        ] {
            assert!(
                labels["app.kubernetes.io/managed-by"] != "Helm",
                "{} {} says managed-by Helm",
                doc["kind"],
                doc["metadata"]["name"]
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Dockerfile

/// The `COPY` sources of the Dockerfile's first (build) stage.
fn build_stage_inputs(dockerfile: &str) -> Vec<String> {
    let mut inputs = Vec::new();
    let mut stages = 0;
    for line in dockerfile.lines().map(str::trim) {
        if line.starts_with("FROM ") {
            stages += 1;
        }
        if stages != 1 {
            continue;
        }
        if let Some(rest) = line.strip_prefix("COPY ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            if words.iter().any(|w| w.starts_with("--from")) {
                continue;
            }
            inputs.extend(words[..words.len() - 1].iter().map(|w| w.to_string()));
        }
    }
    inputs
}

fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        std::fs::copy(from, to).unwrap();
    }
}

#[test]
fn the_image_build_stage_copies_every_file_cargo_reads() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let inputs = build_stage_inputs(&dockerfile);
    assert!(inputs.contains(&"src".to_string()), "{inputs:?}");
    let context = tempfile::tempdir().expect("temp dir");
    for input in &inputs {
        copy_tree(&root().join(input), &context.path().join(input));
    }
    // `cargo fetch` loads the whole manifest (every declared target) and the lock file, as the
    // image's `cargo build --locked` does, without compiling.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["fetch", "--offline", "--locked"])
        .current_dir(context.path())
        .output()
        .expect("run cargo fetch");
    assert!(
        output.status.success(),
        "the Dockerfile's build stage lacks files that cargo needs (COPY them): {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_image_runs_as_the_user_and_paths_the_chart_expects() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let docs = render(&[]);
    let deployment = find(&docs, "Deployment", "sequenced");
    let user = container(deployment)["securityContext"]["runAsUser"]
        .as_i64()
        .unwrap();
    assert!(
        dockerfile
            .lines()
            .any(|l| l.trim() == format!("USER {user}:{user}")),
        "the image's USER is not the chart's runAsUser {user}"
    );
    assert!(dockerfile.contains("ENTRYPOINT [\"/usr/local/bin/sequenced\"]"));
    // The chart passes `run` itself; the image's default command is the same.
    assert!(dockerfile.contains("CMD [\"run\"]"));
    for name in [
        "SEQUENCED_CACHE_DIR",
        "HELM_CACHE_HOME",
        "HELM_CONFIG_HOME",
        "HELM_DATA_HOME",
    ] {
        let value = env(container(deployment), name)["value"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            dockerfile.contains(&format!("{name}={value}")),
            "the image and the chart disagree on {name} ({value} in the chart)"
        );
    }
    assert!(
        dockerfile.contains("sha256sum -c"),
        "helm's download is not checked"
    );
}

#[test]
fn replicas_share_the_shards_through_leases_in_the_operators_namespace() {
    for args in [
        &[][..],
        &["--set", "rbac.releaseNamespaces={team-a}"][..],
        &["--set", "tenancy.multiTenant=true"][..],
    ] {
        let docs = render(args);
        let (name, namespace) = pod_account(&docs);
        // The shard and member Leases live in the operator's own namespace, whatever namespaces
        // releases may be in.
        let rules = granted(&docs, (&name, &namespace), Some(&namespace));
        for verb in ["get", "list", "create", "update", "delete"] {
            assert!(
                allows(&rules, "coordination.k8s.io", "leases", verb),
                "{args:?}: cannot {verb} leases in {namespace}"
            );
        }
    }
    let docs = render(&["--set", "replicas=3", "--set", "shards.count=64"]);
    let deployment = find(&docs, "Deployment", "sequenced");
    assert_eq!(deployment["spec"]["replicas"], 3);
    let container = container(deployment);
    assert_eq!(env(container, "SEQUENCED_SHARDS")["value"], "64");
    assert_eq!(
        env(container, "SEQUENCED_SHARD_LEASE_DURATION")["value"],
        "15s"
    );
    assert_eq!(
        env(container, "POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
}
