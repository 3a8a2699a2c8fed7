//! The end of a hook's log: the pod a hook Job ran (or the hook Pod itself), read through
//! `pods/log` as `helm.sh/hook-output-log-policy` has Helm read it, so that a failed hook is
//! diagnosed from the release's status.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, ListParams, LogParams};
use serde_json::Value;

use super::{Cluster, ClusterError};
use crate::rollout::HookLog;

/// How much of a log is read at most (its last lines, before they are cut to
/// [`HookLog::MAX_BYTES`]).
const READ_BYTES: i64 = 64 * 1024;

/// A refusal that trying again does not change: a pod whose container never started (400), a
/// log that may not be read (403), a pod gone (404). The failure is told without it.
fn unreadable(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if matches!(status.code, 400 | 403 | 404))
}

/// A 403: who may not do what, to be told in the log's place (in multi-tenant mode logs are
/// read as the release's account, which a team may not have granted `pods/log`).
fn refused(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 403)
}

/// The container to read: one that failed (an init container first, as it ran first), else
/// the first of the pod.
fn container_of(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref();
    let failed = |statuses: Option<&Vec<ContainerStatus>>| {
        statuses?
            .iter()
            .find(|c| {
                let terminated = c.state.as_ref().and_then(|s| s.terminated.as_ref());
                terminated.is_some_and(|t| t.exit_code != 0)
            })
            .map(|c| c.name.clone())
    };
    failed(status.and_then(|s| s.init_container_statuses.as_ref()))
        .or_else(|| failed(status.and_then(|s| s.container_statuses.as_ref())))
        .or_else(|| Some(pod.spec.as_ref()?.containers.first()?.name.clone()))
}

/// The pod to read of a Job's: the newest that failed, else the newest.
fn pick(mut pods: Vec<Pod>) -> Option<Pod> {
    pods.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
    });
    let failed = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed");
    match pods.iter().rposition(failed) {
        Some(i) => Some(pods.swap_remove(i)),
        None => pods.pop(),
    }
}

impl Cluster {
    /// The end of the log of `hook` (a Job or Pod as the cluster has it): for a Job, of the
    /// pod it made (by the `job-name` label Helm reads them by, and owned by this Job); None when
    /// there is no pod or no log to read (a pod that never started, logs this controller may not
    /// read).
    pub async fn hook_log(&self, hook: &Value) -> Result<Option<HookLog>, ClusterError> {
        let kind = hook.get("kind").and_then(Value::as_str).unwrap_or_default();
        let meta = |field: &str| {
            hook.pointer(&format!("/metadata/{field}"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (namespace, name, uid) = (meta("namespace"), meta("name"), meta("uid"));
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let who = self
            .account()
            .map_or_else(|| "the controller".to_string(), ToString::to_string);
        let may_not = |what: &str| format!("{who} may not {what} in namespace {namespace}");
        let pod = match kind {
            "Pod" => match pods.get_opt(&name).await {
                Ok(pod) => pod,
                Err(e) if self.starts(&e) => {
                    return Err(self.api_error("reading", format!("Pod {namespace}/{name}"), e));
                }
                Err(e) if refused(&e) => {
                    return Ok(Some(HookLog::unreadable(&name, "", &may_not("get pods"))));
                }
                Err(e) if unreadable(&e) => return Ok(None),
                Err(e) => {
                    return Err(self.api_error("reading", format!("Pod {namespace}/{name}"), e));
                }
            },
            _ => {
                let params = ListParams::default().labels(&format!("job-name={name}"));
                let listed = match pods.list(&params).await {
                    Ok(listed) => listed,
                    Err(e) if self.starts(&e) => {
                        let what = format!("the Pods of Job {namespace}/{name}");
                        return Err(self.api_error("listing", what, e));
                    }
                    Err(e) if refused(&e) => {
                        return Ok(Some(HookLog::unreadable("", "", &may_not("list pods"))));
                    }
                    Err(e) if unreadable(&e) => return Ok(None),
                    Err(e) => {
                        let what = format!("the Pods of Job {namespace}/{name}");
                        return Err(self.api_error("listing", what, e));
                    }
                };
                let owned = listed.items.into_iter().filter(|p| {
                    p.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.uid == uid)
                });
                pick(owned.collect())
            }
        };
        let Some(pod) = pod else {
            return Ok(None);
        };
        let (Some(pod_name), Some(container)) = (pod.metadata.name.clone(), container_of(&pod))
        else {
            return Ok(None);
        };
        let params = LogParams {
            container: Some(container.clone()),
            tail_lines: Some(HookLog::MAX_LINES as i64),
            limit_bytes: Some(READ_BYTES),
            ..LogParams::default()
        };
        match pods.logs(&pod_name, &params).await {
            Ok(text) => Ok(Some(HookLog::tail(&pod_name, &container, &text))),
            Err(e) if self.starts(&e) => Err(self.api_error(
                "reading the log of",
                format!("Pod {namespace}/{pod_name}"),
                e,
            )),
            Err(e) if refused(&e) => Ok(Some(HookLog::unreadable(
                &pod_name,
                &container,
                &may_not("get pods/log"),
            ))),
            Err(e) if unreadable(&e) => {
                tracing::debug!(pod = %pod_name, error = %e, "no log to read");
                Ok(None)
            }
            Err(e) => Err(self.api_error(
                "reading the log of",
                format!("Pod {namespace}/{pod_name}"),
                e,
            )),
        }
    }
}

impl Cluster {
    /// Whether the API server that answered `error` is starting: its refusal says nothing about
    /// the log (tried again, as [`Cluster::error`] judges).
    fn starts(&self, error: &kube::Error) -> bool {
        super::starting(&self.health, error).is_some()
    }
}
