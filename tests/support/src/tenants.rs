//! Teams on a shared cluster, for the tenancy and attack scenarios: namespaces whose
//! ServiceAccount `deployer` has only the rights a test grants it, and the operator's own
//! ServiceAccount with the RBAC its chart renders, so that the controller runs with exactly the
//! rights a `helm install` of the chart gives it (never as the cluster's administrator).

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::apiserver::RecordedRequest;
use crate::operator::{Controller, Operator, is_write};

/// The namespace the operator's chart is installed into.
pub const OPERATOR_NAMESPACE: &str = "sequenced-system";
/// The user the controller runs as: the chart's ServiceAccount.
pub const OPERATOR_ACCOUNT: &str = "system:serviceaccount:sequenced-system:sequenced";
/// The ServiceAccount each team's releases act as.
pub const DEPLOYER: &str = "deployer";

/// Applies `object` as the cluster admin (server-side apply).
pub async fn admin_apply(op: &Operator, object: Value) {
    apply_with(op.client.clone(), object).await;
}

/// Applies `object` through `client` (server-side apply, field manager `test-admin`, taking the
/// fields over from any other manager), panicking with the kind and name when it is refused.
pub async fn apply_with(client: kube::Client, object: Value) {
    let api_version = object["apiVersion"].as_str().unwrap_or("v1").to_string();
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client, ns, &resource),
        None => Api::all_with(client, &resource),
    };
    api.patch(
        &name,
        &PatchParams::apply("test-admin").force(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
}

/// The rules of a team that may do everything a release does with ConfigMaps in its namespace.
pub fn config_map_rules() -> Value {
    json!([{"apiGroups": [""], "resources": ["configmaps"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}])
}

/// Namespace `namespace` with ServiceAccount [`DEPLOYER`], bound to a Role with `rules` there.
pub async fn tenant(op: &Operator, namespace: &str, rules: Value) {
    op.namespace(namespace).await;
    admin_apply(
        op,
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": DEPLOYER, "namespace": namespace}}),
    )
    .await;
    admin_apply(
        op,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": DEPLOYER, "namespace": namespace},
               "rules": rules}),
    )
    .await;
    admin_apply(
        op,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": DEPLOYER, "namespace": namespace},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": DEPLOYER},
               "subjects": [{"kind": "ServiceAccount", "name": DEPLOYER, "namespace": namespace}]}),
    )
    .await;
}

/// The objects of the operator's own chart, rendered into `namespace` with `args` (`--set ...`).
pub fn operator_chart(namespace: &str, args: &[&str]) -> Vec<Value> {
    let output = std::process::Command::new(crate::helm())
        .args(["template", "sequenced"])
        .arg(crate::charts::repo().join("charts/sequenced"))
        .args(["--namespace", namespace])
        .args(args)
        .output()
        .expect("helm template");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    sequenced::yaml::parse_documents(&String::from_utf8_lossy(&output.stdout))
        .expect("YAML")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// Installs the operator chart's ServiceAccount, RBAC and admission policy (in multi-tenant
/// mode, the ValidatingAdmissionPolicy that holds its Secret writes to release records),
/// rendered with `args`, as `helm install` would create them, in [`OPERATOR_NAMESPACE`]; a
/// controller started with [`crate::apiserver::TestApiServer::config_as_user`] for
/// [`OPERATOR_ACCOUNT`] then has exactly those rights. The namespaces of
/// `rbac.releaseNamespaces` must exist first.
pub async fn install_operator_rbac(op: &Operator, args: &[&str]) {
    op.namespace(OPERATOR_NAMESPACE).await;
    for doc in operator_chart(OPERATOR_NAMESPACE, args) {
        let kind = doc["kind"].as_str().unwrap_or("");
        if kind == "ServiceAccount"
            || kind.contains("Role")
            || kind.starts_with("ValidatingAdmissionPolicy")
        {
            let mut doc = doc.clone();
            if matches!(kind, "ServiceAccount" | "Role" | "RoleBinding")
                && doc["metadata"]["namespace"].is_null()
            {
                doc["metadata"]["namespace"] = json!(OPERATOR_NAMESPACE);
            }
            admin_apply(op, doc).await;
        }
    }
}

/// A fresh server with the operator chart's ServiceAccount and RBAC (rendered with `args`, e.g.
/// `--set tenancy.multiTenant=true`) and a controller running as that ServiceAccount, with its
/// options changed by `configure` (see [`Controller::start_configured`]).
pub async fn operator_as_chart(
    args: &[&str],
    configure: impl FnOnce(&mut sequenced::controller::Options),
) -> Operator {
    let mut op = Operator::without_controller().await;
    install_operator_rbac(&op, args).await;
    let controller = Controller::start_configured(
        op.server
            .config_as_user("test-controller", OPERATOR_ACCOUNT, &[]),
        "test-controller",
        4,
        configure,
    );
    op.adopt(controller);
    op
}

/// Whether `r` is a write of the controller's books: a SequencedRelease (its status, its
/// finalizer), an Event, a Lease, an access review, or a Helm release record (a Secret named
/// `sh.helm.release.v1.*`); anything else the controller writes as itself is not.
pub fn is_book(r: &RecordedRequest) -> bool {
    let record = r.kind.as_deref() == Some("Secret")
        && r.name
            .as_deref()
            .is_some_and(|n| n.starts_with("sh.helm.release.v1."));
    matches!(
        r.kind.as_deref(),
        Some("SequencedRelease" | "Lease" | "Event")
    ) || record
        || r.path.ends_with("/selfsubjectaccessreviews")
}

/// A request as a failing assertion names it.
pub fn describe(r: &RecordedRequest) -> String {
    format!(
        "{} {}?{} as {} -> {}",
        r.method,
        r.path,
        r.query,
        r.user.as_deref().unwrap_or("the cluster admin"),
        r.status
    )
}

/// The requests of the controller recorded as `client` that the server refused (RBAC, or an
/// admission policy).
pub fn refused(op: &Operator, client: &str) -> Vec<String> {
    op.server
        .requests()
        .iter()
        .filter(|r| r.client.as_deref() == Some(client) && matches!(r.status, 401 | 403 | 422))
        .map(describe)
        .collect()
}

/// The writes the controller recorded as `client` made as `user` (its own identity) that are
/// not its books ([`is_book`]).
pub fn beyond_books(op: &Operator, client: &str, user: &str) -> Vec<String> {
    op.server
        .requests()
        .iter()
        .filter(|r| r.client.as_deref() == Some(client) && is_write(r))
        .filter(|r| r.user.as_deref() == Some(user) && !is_book(r))
        .map(describe)
        .collect()
}
