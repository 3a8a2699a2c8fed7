//! What kube-apiserver does for Pods beyond storing them: the ServiceAccount admission plugin
//! (plugin/pkg/admission/serviceaccount) and the `log` subresource (pkg/registry/core/pod,
//! `LogLocation`, with the answers the kubelet gives through it).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::errors::{ApiError, FieldError};
use super::store::{Key, State};
use super::util::{at, meta_str, str_at};

/// The ServiceAccount a Pod without `spec.serviceAccountName` runs as.
const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// The annotation that marks a static Pod's mirror, which admission leaves alone.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What a container wrote, as the kubelet keeps it: the text and when it was written.
#[derive(Debug, Clone)]
pub struct Log {
    pub text: String,
    /// RFC 3339 with nanoseconds, as `timestamps=true` prefixes each line.
    pub at: String,
}

/// Container logs by (namespace, pod, container).
pub type Logs = BTreeMap<(String, String, String), Log>;

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

/// The options of a log request (PodLogOptions from the query).
struct LogOptions {
    container: String,
    tail_lines: Option<i64>,
    limit_bytes: Option<i64>,
    timestamps: bool,
    previous: bool,
}

/// The first value of a query parameter, as the parameter codec reads it.
fn first<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A boolean query parameter: absent, `0` and `false` are false, anything else true.
fn flag(params: &[(String, String)], name: &str) -> bool {
    first(params, name).is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"))
}

fn int(params: &[(String, String)], name: &str) -> Result<Option<i64>, ApiError> {
    first(params, name)
        .map(|v| {
            v.parse::<i64>().map_err(|_| {
                ApiError::bad_request(format!("strconv.ParseInt: parsing \"{v}\": invalid syntax"))
            })
        })
        .transpose()
}

/// Decodes and validates the options (ValidatePodLogOptions), before the Pod is looked up.
fn log_options(params: &[(String, String)], pod: &str) -> Result<LogOptions, ApiError> {
    let options = LogOptions {
        container: first(params, "container").unwrap_or("").to_string(),
        tail_lines: int(params, "tailLines")?,
        limit_bytes: int(params, "limitBytes")?,
        timestamps: flag(params, "timestamps"),
        previous: flag(params, "previous"),
    };
    let since_seconds = int(params, "sinceSeconds")?;
    let mut errs = Vec::new();
    if let Some(n) = options.tail_lines.filter(|n| *n < 0) {
        errs.push(FieldError::invalid_raw(
            "tailLines",
            n.to_string(),
            "must be greater than or equal to 0",
        ));
    }
    if let Some(n) = options.limit_bytes.filter(|n| *n < 1) {
        errs.push(FieldError::invalid_raw(
            "limitBytes",
            n.to_string(),
            "must be greater than 0",
        ));
    }
    if since_seconds.is_some() && first(params, "sinceTime").is_some() {
        errs.push(FieldError::forbidden(
            "",
            "at most one of `sinceTime` or `sinceSeconds` may be specified",
        ));
    } else if let Some(n) = since_seconds.filter(|n| *n < 1) {
        errs.push(FieldError::invalid_raw(
            "sinceSeconds",
            n.to_string(),
            "must be greater than 0",
        ));
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid("", "PodLogOptions", pod, &errs));
    }
    Ok(options)
}

fn names(pod: &Value, list: &str) -> Vec<String> {
    at(pod, &["spec", list])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str).map(String::from))
        .collect()
}

/// validateContainer: the container asked for, or the only one.
fn container(pod: &Value, pod_name: &str, asked: &str) -> Result<String, ApiError> {
    let containers = names(pod, "containers");
    let mut all = names(pod, "initContainers");
    all.extend(containers.iter().cloned());
    all.extend(names(pod, "ephemeralContainers"));
    if asked.is_empty() {
        return match containers.as_slice() {
            [only] => Ok(only.clone()),
            [] => Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {pod_name}"
            ))),
            _ => Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {pod_name}, choose one of: [{}]",
                all.join(" ")
            ))),
        };
    }
    if !all.iter().any(|c| c == asked) {
        return Err(ApiError::bad_request(format!(
            "container {asked} is not valid for pod {pod_name}"
        )));
    }
    Ok(asked.to_string())
}

/// The kubelet's validateContainerLogStatus: whether the container has logs to show. A
/// container no kubelet reported on is one being created, as right after the Pod was
/// scheduled.
fn check_started(
    pod: &Value,
    pod_name: &str,
    container: &str,
    previous: bool,
) -> Result<(), ApiError> {
    let refuse = |why: String| {
        Err(ApiError::bad_request(format!(
            "container \"{container}\" in pod \"{pod_name}\" {why}"
        )))
    };
    let status = [
        "containerStatuses",
        "initContainerStatuses",
        "ephemeralContainerStatuses",
    ]
    .iter()
    .filter_map(|list| at(pod, &["status", list]).and_then(Value::as_array))
    .flatten()
    .find(|s| s.get("name").and_then(Value::as_str) == Some(container));
    let Some(status) = status else {
        let initialising = !names(pod, "initContainers").is_empty()
            && names(pod, "containers").iter().any(|c| c == container);
        let reason = if initialising {
            "PodInitializing"
        } else {
            "ContainerCreating"
        };
        return refuse(format!("is waiting to start: {reason}"));
    };
    let id = |state: &str| {
        status
            .pointer(&format!("/{state}/terminated/containerID"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .is_some()
    };
    let state = |k: &str| {
        status
            .pointer(&format!("/state/{k}"))
            .filter(|v| !v.is_null())
    };
    if previous {
        if !id("lastState") {
            return Err(ApiError::bad_request(format!(
                "previous terminated container \"{container}\" in pod \"{pod_name}\" not found"
            )));
        }
        return Ok(());
    }
    if state("running").is_some() {
        return Ok(());
    }
    if state("terminated").is_some() {
        return if id("state") || id("lastState") {
            Ok(())
        } else {
            refuse("is terminated".into())
        };
    }
    if status
        .pointer("/lastState/terminated")
        .is_some_and(|v| !v.is_null())
    {
        return if id("lastState") {
            Ok(())
        } else {
            refuse("is terminated".into())
        };
    }
    if let Some(waiting) = state("waiting") {
        let reason = waiting.get("reason").and_then(Value::as_str).unwrap_or("");
        return refuse(match reason {
            "ErrImagePull" => "is waiting to start: image can't be pulled".into(),
            "ImagePullBackOff" => "is waiting to start: trying and failing to pull image".into(),
            _ => format!("is waiting to start: {reason}"),
        });
    }
    refuse("is waiting to start - no logs yet".into())
}

/// `GET .../pods/NAME/log`: the container's log as the kubelet sends it, cut by `tailLines`
/// (the last lines) and `limitBytes` (the first bytes of what would be sent), each line
/// prefixed with its time for `timestamps`. A previous instance's log is empty: none is kept.
pub fn log(
    state: &State,
    namespace: &str,
    name: &str,
    params: &[(String, String)],
) -> Result<Vec<u8>, ApiError> {
    let options = log_options(params, name)?;
    let key = Key {
        group: String::new(),
        resource: "pods".into(),
        namespace: namespace.to_string(),
        name: name.to_string(),
    };
    let pod = state
        .objects
        .get(&key)
        .ok_or_else(|| ApiError::not_found("", "pods", name))?;
    let container = container(pod, name, &options.container)?;
    check_started(pod, name, &container, options.previous)?;
    let Some(log) = state
        .logs
        .get(&(namespace.to_string(), name.to_string(), container))
        .filter(|_| !options.previous)
    else {
        return Ok(Vec::new());
    };
    let lines: Vec<&str> = log.text.split_inclusive('\n').collect();
    let skip = match options.tail_lines {
        Some(n) => lines
            .len()
            .saturating_sub(usize::try_from(n).unwrap_or(usize::MAX)),
        None => 0,
    };
    let mut out = Vec::new();
    for line in &lines[skip..] {
        if options.timestamps {
            out.extend_from_slice(log.at.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(line.as_bytes());
    }
    if let Some(limit) = options.limit_bytes {
        out.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    Ok(out)
}
