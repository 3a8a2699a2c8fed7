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
chartCache: {size: 1Gi}
render: {outputLimit: 16Mi}
extraVolumes: [{name: charts, configMap: {name: platform-charts}}]
extraVolumeMounts: [{name: charts, mountPath: /charts, readOnly: true}]
networkPolicy:
  enabled: true
  apiServer: {cidrs: [10.0.0.1/32]}
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
        json!([
            "run",
            "--metrics-addr=0.0.0.0:8080",
            "--concurrency=16",
            "--chart-cache-size=512Mi",
            "--render-output-limit=32Mi"
        ])
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
    // Target namespaces are created, and ConfigMaps read, as the release's service account.
    let missing: Vec<String> = missing_needs(&rules)
        .into_iter()
        .filter(|m| m != "create namespaces." && m != "get configmaps.")
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
    assert!(args.contains(&"--multi-tenant"), "{args:?}");
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
        !default_args.contains("service-account")
            && !default_args.contains("cross-namespace")
            && !default_args.contains("multi-tenant"),
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
    assert_eq!(
        pod["volumes"][1],
        json!({"name": "charts", "configMap": {"name": "platform-charts"}})
    );
    assert_eq!(
        container["volumeMounts"][1],
        json!({"name": "charts", "mountPath": "/charts", "readOnly": true})
    );
    let args = strings(&container["args"]);
    assert!(args.contains(&"--chart-cache-size=1Gi"), "{args:?}");
    assert!(args.contains(&"--render-output-limit=16Mi"), "{args:?}");
    find(&docs, "NetworkPolicy", "sequenced");
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
        json!([
            "run",
            "--metrics-addr=0.0.0.0:8080",
            "--concurrency=16",
            "--chart-cache-size=512Mi",
            "--render-output-limit=32Mi"
        ])
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

// ---------------------------------------------------------------------------------------------
// Tenancy flags, least privilege, the record policy and the NetworkPolicy

fn args_of(docs: &[Value]) -> Vec<String> {
    strings(&container(find(docs, "Deployment", "sequenced"))["args"])
        .into_iter()
        .map(String::from)
        .collect()
}

#[test]
fn the_tenancy_cache_and_render_values_reach_the_controllers_flags() {
    let docs = render(&[
        "--set",
        "tenancy.multiTenant=true",
        "--set",
        "tenancy.allowLocalCharts={/charts/platform,/charts/shared}",
        "--set",
        "tenancy.requireVerifiedCharts=true",
        "--set",
        "tenancy.chartSources={charts.example.com,*.registry.example.com,10.20.0.0/16}",
        "--set",
        "tenancy.deniedCIDRs={100.64.0.0/10}",
        "--set",
        "chartCache.size=256Mi",
        "--set",
        "render.outputLimit=8Mi",
    ]);
    let args = args_of(&docs);
    for flag in [
        "--multi-tenant",
        "--allow-local-charts=/charts/platform",
        "--allow-local-charts=/charts/shared",
        "--require-verified-charts",
        "--chart-source-allow=charts.example.com",
        "--chart-source-allow=*.registry.example.com",
        "--chart-source-allow=10.20.0.0/16",
        "--chart-source-deny=100.64.0.0/10",
        "--chart-cache-size=256Mi",
        "--render-output-limit=8Mi",
    ] {
        assert!(args.iter().any(|a| a == flag), "no {flag} in {args:?}");
    }
    // Each flag is one the binary takes, with a value it accepts.
    use clap::Parser as _;
    let cli = sequenced::cli::Cli::try_parse_from(
        std::iter::once("sequenced".to_string()).chain(args.iter().cloned()),
    );
    assert!(cli.is_ok(), "sequenced {args:?}: {:?}", cli.err());
}

#[test]
fn a_chart_cache_that_does_not_fit_the_tmp_empty_dir_is_refused() {
    let message = render_error(&["--set", "chartCache.size=1Gi"]);
    assert!(
        message.contains("chartCache.size 1Gi is not under tmp.sizeLimit 1Gi"),
        "{message}"
    );
    let message = render_error(&["--set", "chartCache.size=3G", "--set", "tmp.sizeLimit=2Gi"]);
    assert!(message.contains("tmp.sizeLimit 2Gi"), "{message}");
    // Room to spare, and a quantity the chart cannot compare is left to the user.
    render(&["--set", "chartCache.size=1Gi", "--set", "tmp.sizeLimit=4Gi"]);
    render(&["--set", "tmp.sizeLimit=1.5Gi"]);
    let message = render_error(&["--set", "chartCache.size=lots"]);
    assert!(message.contains("chartCache"), "{message}");
}

#[test]
fn multi_tenant_rbac_reads_no_pod_logs_and_writes_secrets_only_where_releases_live() {
    let docs = render(&[
        "--set",
        "tenancy.multiTenant=true",
        "--set",
        "rbac.releaseNamespaces={team-a,team-b}",
    ]);
    let (name, namespace) = pod_account(&docs);
    let cluster_wide = granted(&docs, (&name, &namespace), None);
    // Hook logs are read as the release's account.
    for (resource, verb) in [("pods", "get"), ("pods", "list"), ("pods/log", "get")] {
        assert!(
            !allows(&cluster_wide, "", resource, verb),
            "the controller may {verb} {resource}"
        );
    }
    // No Secret or ConfigMap at all outside the release namespaces.
    for verb in [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ] {
        assert!(
            !allows(&cluster_wide, "", "secrets", verb),
            "the controller may {verb} Secrets in every namespace"
        );
        assert!(
            !allows(&cluster_wide, "", "configmaps", verb),
            "the controller may {verb} ConfigMaps in every namespace"
        );
    }
    for team in ["team-a", "team-b"] {
        let rules = granted(&docs, (&name, &namespace), Some(team));
        // Its records, and the metadata watches of the inputs releases read.
        for verb in ["get", "list", "watch", "create", "patch", "delete"] {
            assert!(
                allows(&rules, "", "secrets", verb),
                "{verb} secrets in {team}"
            );
        }
        for verb in ["list", "watch"] {
            assert!(
                allows(&rules, "", "configmaps", verb),
                "{verb} configmaps in {team}"
            );
        }
        // ConfigMaps are read as the release's account.
        assert!(
            !allows(&rules, "", "configmaps", "get"),
            "get configmaps in {team}"
        );
        let missing: Vec<String> = missing_needs(&rules)
            .into_iter()
            .filter(|m| m != "create namespaces." && m != "get configmaps.")
            .collect();
        assert_eq!(missing, Vec::<String>::new(), "in {team}");
    }
    let elsewhere = granted(&docs, (&name, &namespace), Some("team-c"));
    assert!(!allows(&elsewhere, "", "secrets", "create"));
    assert!(!allows(&elsewhere, "", "secrets", "list"));
    // Without releaseNamespaces the same rules are granted in every namespace, and nothing more.
    let docs = render(&["--set", "tenancy.multiTenant=true"]);
    let rules = granted(&docs, (&name, &namespace), None);
    assert!(allows(&rules, "", "secrets", "create"));
    assert!(!allows(&rules, "", "configmaps", "get"));
    assert!(!allows(&rules, "", "pods/log", "get"));
}

/// The record policy and its binding, rendered with `args`.
fn record_policy(args: &[&str]) -> (Value, Value) {
    let docs = render(args);
    let policy = find(
        &docs,
        "ValidatingAdmissionPolicy",
        "sequenced-release-records",
    )
    .clone();
    let binding = find(
        &docs,
        "ValidatingAdmissionPolicyBinding",
        "sequenced-release-records",
    )
    .clone();
    (policy, binding)
}

#[test]
fn the_record_policy_comes_with_multi_tenant_mode_and_names_the_controllers_account() {
    let (policy, binding) = record_policy(&["--set", "tenancy.multiTenant=true"]);
    assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"],
        json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["secrets"]}])
    );
    let condition = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert_eq!(
        condition,
        "request.userInfo.username == \"system:serviceaccount:sequenced-system:sequenced\""
    );
    assert_eq!(binding["spec"]["policyName"], "sequenced-release-records");
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    // Another service account name is followed.
    let (policy, _) = record_policy(&[
        "--set",
        "tenancy.multiTenant=true",
        "--set",
        "serviceAccount.name=operator",
    ]);
    assert!(
        policy["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap()
            .ends_with("\"system:serviceaccount:sequenced-system:operator\"")
    );
    // Off on request; never without multi-tenant mode (the controller then writes charts'
    // Secrets with its own rights).
    let docs = render(&[
        "--set",
        "tenancy.multiTenant=true",
        "--set",
        "tenancy.recordPolicy=false",
    ]);
    assert!(of_kind(&docs, "ValidatingAdmissionPolicy").is_empty());
    assert!(of_kind(&render(&[]), "ValidatingAdmissionPolicy").is_empty());
    let message = render_error(&["--set", "tenancy.recordPolicy=true"]);
    assert!(
        message.contains("tenancy.recordPolicy needs tenancy.multiTenant"),
        "{message}"
    );
}

#[test]
fn the_record_policy_is_admitted_by_an_api_server_and_holds_the_controller_to_its_records() {
    let (policy, binding) = record_policy(&["--set", "tenancy.multiTenant=true"]);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async {
        use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
        use kube::core::{ApiResource, GroupVersionKind};
        let server = support::apiserver::TestApiServer::start().await;
        let admin = server.client();
        // Created as `helm install` would: the API server checks both and compiles their CEL.
        for object in [&policy, &binding] {
            let kind = object["kind"].as_str().unwrap();
            let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                kind,
            ));
            let api: Api<DynamicObject> = Api::all_with(admin.clone(), &resource);
            let object: DynamicObject = serde_json::from_value(object.clone()).unwrap();
            api.create(&PostParams::default(), &object)
                .await
                .unwrap_or_else(|e| panic!("{kind} refused: {e}"));
        }
        let operator = server.client_as_user(
            "operator",
            "system:serviceaccount:sequenced-system:sequenced",
            &[],
        );
        let secrets = |client: &kube::Client| -> Api<k8s_openapi::api::core::v1::Secret> {
            Api::namespaced(client.clone(), "default")
        };
        let secret = |name: &str, type_: &str, ours: bool| -> k8s_openapi::api::core::v1::Secret {
            let mut metadata = json!({"name": name});
            if ours {
                metadata["labels"] = json!({"app.kubernetes.io/managed-by": "sequenced", "owner": "helm"});
                metadata["annotations"] = json!({"sequenced.dev/owner": "default/shop"});
            }
            serde_json::from_value(json!({"metadata": metadata, "type": type_, "data": {"release": "eA=="}}))
                .unwrap()
        };
        // The operator's RBAC is not what is tested here: it may write any Secret in default.
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "operator-admin"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "sequenced", "namespace": "sequenced-system"}]});
        let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(admin.clone());
        bindings
            .create(&PostParams::default(), &serde_json::from_value(role).unwrap())
            .await
            .unwrap();
        let post = PostParams::default();
        // A record of its own: written and deleted.
        secrets(&operator)
            .create(&post, &secret("sh.helm.release.v1.shop.v1", "helm.sh/release.v1", true))
            .await
            .expect("a record is written");
        secrets(&operator)
            .delete("sh.helm.release.v1.shop.v1", &DeleteParams::default())
            .await
            .expect("a record is deleted");
        // Anything else is refused, as kube-apiserver words it.
        for (name, type_, ours) in [
            ("db-password", "Opaque", true),
            ("sh.helm.release.v1.shop.v2", "Opaque", true),
            ("tls", "helm.sh/release.v1", true),
            ("sh.helm.release.v1.shop.v3", "helm.sh/release.v1", false),
        ] {
            let refused = secrets(&operator)
                .create(&post, &secret(name, type_, ours))
                .await
                .expect_err("refused");
            let kube::Error::Api(status) = refused else {
                panic!("{name}: {refused}")
            };
            assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"), "{name}");
            assert!(
                status.message.starts_with(&format!(
                    "secrets \"{name}\" is forbidden: ValidatingAdmissionPolicy 'sequenced-release-records' with binding 'sequenced-release-records' denied request: the sequenced operator may write only"
                )),
                "{}",
                status.message
            );
        }
        // A Secret the operator did not write is neither updated nor deleted by it; the
        // administrator (or any other user) is not held by the policy.
        secrets(&admin)
            .create(&post, &secret("sh.helm.release.v1.other.v1", "helm.sh/release.v1", false))
            .await
            .expect("the administrator writes what it likes");
        let refused = secrets(&operator)
            .delete("sh.helm.release.v1.other.v1", &DeleteParams::default())
            .await
            .expect_err("a Helm release's record is not the operator's");
        assert!(refused.to_string().contains("may write only the release records it writes"), "{refused}");
        // Records of the earlier format may be deleted, not written.
        secrets(&admin)
            .create(&post, &secret("sequenced.release.v1.shop.v1", "sequenced.dev/release.v1", true))
            .await
            .unwrap();
        secrets(&operator)
            .delete("sequenced.release.v1.shop.v1", &DeleteParams::default())
            .await
            .expect("an earlier record is deleted");
        secrets(&operator)
            .create(&post, &secret("sequenced.release.v1.shop.v2", "sequenced.dev/release.v1", true))
            .await
            .expect_err("an earlier record is not written");
    });
}

#[test]
fn the_restricted_profile_grants_the_namespaced_kinds_charts_hold_and_nothing_cluster_scoped() {
    let docs = render(&["--set", "rbac.profile=restricted"]);
    let (name, namespace) = pod_account(&docs);
    let rules = granted(&docs, (&name, &namespace), None);
    assert_eq!(
        missing_needs(&rules)
            .into_iter()
            .filter(|m| m != "create namespaces.")
            .collect::<Vec<_>>(),
        Vec::<String>::new()
    );
    for (group, resource) in [
        ("apps", "deployments"),
        ("apps", "statefulsets"),
        ("apps", "daemonsets"),
        ("batch", "jobs"),
        ("batch", "cronjobs"),
        ("", "services"),
        ("", "configmaps"),
        ("", "secrets"),
        ("", "serviceaccounts"),
        ("", "persistentvolumeclaims"),
        ("", "pods"),
        ("networking.k8s.io", "ingresses"),
        ("networking.k8s.io", "networkpolicies"),
        ("policy", "poddisruptionbudgets"),
        ("autoscaling", "horizontalpodautoscalers"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
    ] {
        for verb in ["get", "list", "watch", "create", "patch", "delete"] {
            assert!(
                allows(&rules, group, resource, verb),
                "cannot {verb} {resource}.{group}"
            );
        }
    }
    for (group, resource, verb) in [
        (
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "create",
        ),
        ("rbac.authorization.k8s.io", "clusterroles", "create"),
        ("rbac.authorization.k8s.io", "clusterrolebindings", "create"),
        ("", "namespaces", "create"),
        ("", "nodes", "get"),
        ("", "persistentvolumes", "create"),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            "create",
        ),
        ("storage.k8s.io", "storageclasses", "create"),
        ("example.com", "widgets", "create"),
        // Granting more than it holds: no escalate, no bind.
        ("rbac.authorization.k8s.io", "roles", "escalate"),
        ("rbac.authorization.k8s.io", "rolebindings", "bind"),
        ("rbac.authorization.k8s.io", "clusterroles", "bind"),
    ] {
        assert!(
            !allows(&rules, group, resource, verb),
            "may {verb} {resource}.{group}"
        );
    }
    assert!(
        !rules.iter().any(|r| strings(&r["verbs"]).contains(&"*")
            || strings(&r["resources"]).contains(&"*")
            || strings(&r["apiGroups"]).contains(&"*")),
        "a wildcard: {rules:?}"
    );
    // rbac.rules adds to it.
    let docs = render(&[
        "--set",
        "rbac.profile=restricted",
        "--set",
        "rbac.rules[0].apiGroups={example.com}",
        "--set",
        "rbac.rules[0].resources={widgets}",
        "--set",
        "rbac.rules[0].verbs={get,list,watch,create,patch,delete}",
    ]);
    let rules = granted(&docs, (&name, &namespace), None);
    assert!(allows(&rules, "example.com", "widgets", "create"));
    assert!(allows(&rules, "apps", "deployments", "create"));
    assert!(!allows(
        &rules,
        "rbac.authorization.k8s.io",
        "clusterroles",
        "create"
    ));
    // The profile `custom` is rbac.manageEverything: false.
    let message = render_error(&["--set", "rbac.profile=custom"]);
    assert!(message.contains("rbac.rules is empty"), "{message}");
    let message = render_error(&["--set", "rbac.profile=limited"]);
    assert!(message.contains("profile"), "{message}");
}

#[test]
fn the_network_policy_lets_the_controller_reach_dns_the_api_server_and_chart_sources_only() {
    assert!(of_kind(&render(&[]), "NetworkPolicy").is_empty());
    let message = render_error(&["--set", "networkPolicy.enabled=true"]);
    assert!(
        message.contains("networkPolicy.apiServer.cidrs"),
        "{message}"
    );
    let docs = render(&[
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.apiServer.cidrs={172.18.0.2/32}",
        "--set",
        "networkPolicy.apiServer.ports={6443}",
        "--set",
        "tenancy.chartSources={charts.example.com,10.20.0.0/16,192.0.2.7}",
        "--set",
        "networkPolicy.extraEgress[0].to[0].ipBlock.cidr=198.51.100.0/24",
        "--set",
        "networkPolicy.extraEgress[0].ports[0].port=443",
    ]);
    let policy = find(&docs, "NetworkPolicy", "sequenced");
    assert_eq!(policy["metadata"]["namespace"], NAMESPACE);
    let pod_labels =
        &find(&docs, "Deployment", "sequenced")["spec"]["template"]["metadata"]["labels"];
    for (key, value) in policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &pod_labels[key], value,
            "the policy selects the controller's pods"
        );
    }
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    let egress = policy["spec"]["egress"].as_array().unwrap();
    let summary: Vec<(Vec<String>, Vec<String>)> = egress
        .iter()
        .map(|rule| {
            let to = rule["to"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|peer| match peer["ipBlock"]["cidr"].as_str() {
                    Some(cidr) => cidr.to_string(),
                    None => format!(
                        "{}/{}",
                        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
                        peer["podSelector"]["matchLabels"]["k8s-app"]
                    ),
                })
                .collect();
            let ports = rule["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP")))
                .collect();
            (to, ports)
        })
        .collect();
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        summary,
        vec![
            (
                owned(&["\"kube-system\"/\"kube-dns\""]),
                owned(&["53/UDP", "53/TCP"])
            ),
            (owned(&["172.18.0.2/32"]), owned(&["6443/TCP"])),
            // The sources written as addresses; a host name cannot be.
            (owned(&["10.20.0.0/16", "192.0.2.7/32"]), vec![]),
            (owned(&["198.51.100.0/24"]), owned(&["443/TCP"])),
        ]
    );
    // The metrics port, from anywhere unless told.
    assert_eq!(
        policy["spec"]["ingress"],
        json!([{"ports": [{"port": 8080, "protocol": "TCP"}]}])
    );
    let docs = render(&[
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
        "--set",
        "networkPolicy.metrics.from[0].namespaceSelector.matchLabels.name=monitoring",
    ]);
    let policy = find(&docs, "NetworkPolicy", "sequenced");
    assert_eq!(
        policy["spec"]["ingress"][0]["from"],
        json!([{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}])
    );
    assert_eq!(policy["spec"]["egress"].as_array().unwrap().len(), 2);
}
