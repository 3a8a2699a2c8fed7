//! What kube-apiserver does for Pods beyond storing them: the ServiceAccount admission plugin
//! (plugin/pkg/admission/serviceaccount).

use serde_json::{Value, json};

use super::errors::ApiError;
use super::store::{Key, State};
use super::util::{at, meta_str, str_at};

/// The ServiceAccount a Pod without `spec.serviceAccountName` runs as.
const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// The annotation that marks a static Pod's mirror, which admission leaves alone.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Whether creates of this kind go through ServiceAccount admission: Pods.
pub fn admitted(group: &str, kind: &str) -> bool {
    group.is_empty() && kind == "Pod"
}

fn is_mirror(pod: &Value) -> bool {
    at(pod, &["metadata", "annotations", MIRROR_ANNOTATION]).is_some()
}

/// The ServiceAccount a Pod names: `serviceAccountName`, else the deprecated `serviceAccount`,
/// else `default`.
pub fn service_account(pod: &Value) -> String {
    ["serviceAccountName", "serviceAccount"]
        .iter()
        .filter_map(|k| str_at(pod, &["spec", k]))
        .find(|s| !s.is_empty())
        .unwrap_or(DEFAULT_SERVICE_ACCOUNT)
        .to_string()
}

/// ServiceAccount admission of a Pod create in `namespace`: its ServiceAccount must exist. The
/// refusal names the Pod as the body does: its name, else its `generateName` (admission runs
/// before a name is generated), else `Unknown`.
pub fn admit(state: &State, namespace: &str, pod: &Value) -> Result<(), ApiError> {
    if is_mirror(pod) {
        return Ok(());
    }
    let account = service_account(pod);
    let key = Key {
        group: String::new(),
        resource: "serviceaccounts".into(),
        namespace: namespace.to_string(),
        name: account.clone(),
    };
    if state.objects.contains_key(&key) {
        return Ok(());
    }
    let shown = [meta_str(pod, "name"), meta_str(pod, "generateName")]
        .into_iter()
        .flatten()
        .find(|s| !s.is_empty())
        .unwrap_or("Unknown");
    Err(ApiError::forbidden(
        "",
        "pods",
        shown,
        &format!(
            "error looking up service account {namespace}/{account}: serviceaccount \"{account}\" not found"
        ),
    ))
}

/// The admission plugin's mutation of a new Pod: the ServiceAccount it runs as is written
/// down (`default` when it named none), in both fields.
pub fn set_service_account(pod: &mut Value) {
    if is_mirror(pod) {
        return;
    }
    let account = service_account(pod);
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("serviceAccountName".into(), json!(account));
        spec.insert("serviceAccount".into(), json!(account));
    }
}
