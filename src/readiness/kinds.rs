//! The built-in readiness rules, one per kind, following kstatus
//! (`sigs.k8s.io/cli-utils/pkg/kstatus/status`).
//!
//! Where sequencing needs more than kstatus's "the controller has caught up", the rules are
//! stricter, and say so: a Job is ready only when Complete, a failed Pod is a failure, a
//! StatefulSet with the OnDelete strategy still waits for its Pods to be ready, a Service of
//! type LoadBalancer waits for its ingress. Reasons are written for the person reading
//! `kubectl get`: what is missing, with counts and the controller's own words.

use serde_json::Value;

use super::Verdict;

/// A condition of `.status.conditions`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Condition<'a> {
    pub status: &'a str,
    pub reason: &'a str,
    pub message: &'a str,
    pub observed_generation: Option<i64>,
}

impl Condition<'_> {
    fn is_true(&self) -> bool {
        self.status == "True"
    }

    fn is_false(&self) -> bool {
        self.status == "False"
    }

    /// `Reason: message`, or whichever of the two is set.
    fn detail(&self) -> String {
        detail(self.reason, self.message)
    }

    /// ` (Reason: message)`, or nothing when both are empty.
    fn in_parentheses(&self) -> String {
        let detail = self.detail();
        if detail.is_empty() {
            String::new()
        } else {
            format!(" ({detail})")
        }
    }
}

fn detail(reason: &str, message: &str) -> String {
    match (reason.trim(), message.trim()) {
        ("", "") => String::new(),
        (reason, "") => reason.to_string(),
        ("", message) => message.to_string(),
        (reason, message) => format!("{reason}: {message}"),
    }
}

/// The first condition of the given type.
pub(crate) fn condition<'a>(object: &'a Value, kind: &str) -> Option<Condition<'a>> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
        .map(|c| {
            let text = |key: &str| c.get(key).and_then(Value::as_str).unwrap_or_default();
            Condition {
                status: text("status"),
                reason: text("reason"),
                message: text("message"),
                observed_generation: c.get("observedGeneration").and_then(Value::as_i64),
            }
        })
}

fn int(object: &Value, pointer: &str) -> Option<i64> {
    object.pointer(pointer).and_then(Value::as_i64)
}

/// A count of `.status`, which controllers omit when it is zero.
fn count(object: &Value, pointer: &str) -> i64 {
    int(object, pointer).unwrap_or(0)
}

fn text<'a>(object: &'a Value, pointer: &str) -> Option<&'a str> {
    object.pointer(pointer).and_then(Value::as_str)
}

fn flag(object: &Value, pointer: &str) -> bool {
    object
        .pointer(pointer)
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

fn plural(n: i64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn in_progress(reason: impl Into<String>) -> Verdict {
    Verdict::InProgress(reason.into())
}

fn failed(reason: impl Into<String>) -> Verdict {
    Verdict::Failed(reason.into())
}

/// The API group of an object, from its apiVersion: `apps` for `apps/v1`, `` for `v1`.
/// `None` when the object has no apiVersion (then the kind alone decides).
fn group(object: &Value) -> Option<&str> {
    let api_version = object.get("apiVersion")?.as_str()?;
    Some(api_version.rsplit_once('/').map_or("", |(group, _)| group))
}

/// The built-in verdict for an object, with reasons that do not name the object.
/// `completion`: a Pod is ready only when it has Succeeded (hooks).
pub(crate) fn builtin(object: &Value, completion: bool) -> Verdict {
    if let Some(verdict) = generation_not_observed(object) {
        return verdict;
    }
    // kstatus: the standard conditions decide for every kind that sets them.
    if let Some(c) = condition(object, "Stalled").filter(Condition::is_true) {
        return failed(format!("stalled{}", c.in_parentheses()));
    }
    if let Some(c) = condition(object, "Reconciling").filter(Condition::is_true) {
        return in_progress(format!("reconciling{}", c.in_parentheses()));
    }
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let group = group(object);
    let is = |groups: &[&str]| group.is_none_or(|g| groups.contains(&g));
    match kind {
        "Deployment" if is(&["apps", "extensions"]) => deployment(object),
        "StatefulSet" if is(&["apps"]) => stateful_set(object),
        "DaemonSet" if is(&["apps", "extensions"]) => daemon_set(object),
        "ReplicaSet" if is(&["apps", "extensions"]) => replica_set(object),
        "Job" if is(&["batch"]) => job(object),
        "Pod" if is(&[""]) => pod(object, completion),
        "PersistentVolumeClaim" if is(&[""]) => persistent_volume_claim(object),
        "Service" if is(&[""]) => service(object),
        "CustomResourceDefinition" if is(&["apiextensions.k8s.io"]) => {
            custom_resource_definition(object)
        }
        // The disruption controller has computed the allowed disruptions once it has observed
        // the current generation, which `generation_not_observed` checked.
        "PodDisruptionBudget" if is(&["policy"]) => Verdict::Ready,
        _ => generic(object),
    }
}

/// kstatus's generic check: a status written for an older generation says nothing about the
/// current spec.
pub(crate) fn generation_not_observed(object: &Value) -> Option<Verdict> {
    let generation = int(object, "/metadata/generation")?;
    let observed = int(object, "/status/observedGeneration")?;
    (observed < generation).then(|| {
        in_progress(format!(
            "generation {generation} not yet observed by its controller (status is for generation {observed})"
        ))
    })
}

/// Workload controllers always write `observedGeneration`; until they have, nothing in the
/// status is about this object's spec.
fn not_yet_observed(object: &Value, controller: &str) -> Option<Verdict> {
    (int(object, "/metadata/generation").is_some()
        && int(object, "/status/observedGeneration").is_none())
    .then(|| in_progress(format!("not yet observed by the {controller} controller")))
}

fn deployment(object: &Value) -> Verdict {
    if let Some(verdict) = not_yet_observed(object, "deployment") {
        return verdict;
    }
    let progressing = condition(object, "Progressing");
    if let Some(c) = progressing.filter(|c| c.reason == "ProgressDeadlineExceeded") {
        return failed(format!(
            "progress deadline exceeded{}",
            if c.message.is_empty() {
                String::new()
            } else {
                format!(" ({})", c.message)
            }
        ));
    }
    let paused = flag(object, "/spec/paused");
    let waiting = |reason: String| {
        if paused {
            in_progress(format!(
                "{reason}; the rollout is paused (spec.paused is true)"
            ))
        } else {
            in_progress(reason)
        }
    };
    let desired = int(object, "/spec/replicas").unwrap_or(1);
    let replicas = count(object, "/status/replicas");
    let updated = count(object, "/status/updatedReplicas");
    let ready = count(object, "/status/readyReplicas");
    let available = count(object, "/status/availableReplicas");
    if replicas < desired {
        return waiting(format!("{replicas} of {desired} replicas created"));
    }
    if updated < desired {
        return waiting(format!("{updated} of {desired} replicas updated"));
    }
    if replicas > desired {
        return waiting(format!(
            "{} pending termination",
            plural(replicas - desired, "old replica", "old replicas")
        ));
    }
    if available < desired {
        return waiting(format!("{available} of {desired} replicas available"));
    }
    if ready < desired {
        return waiting(format!("{ready} of {desired} replicas ready"));
    }
    // Without a progress deadline the controller sets no Progressing condition; a paused
    // Deployment has Progressing=Unknown (DeploymentPaused) whatever its state.
    let has_deadline = int(object, "/spec/progressDeadlineSeconds")
        .is_some_and(|seconds| seconds != i64::from(i32::MAX));
    if has_deadline && !paused {
        let finished =
            progressing.is_some_and(|c| c.is_true() && c.reason == "NewReplicaSetAvailable");
        if !finished {
            return in_progress(format!(
                "rollout not finished{}",
                progressing.map(|c| c.in_parentheses()).unwrap_or_default()
            ));
        }
    }
    match condition(object, "Available") {
        Some(c) if c.is_true() => Verdict::Ready,
        Some(c) => waiting(format!("not Available{}", c.in_parentheses())),
        None => waiting("no Available condition yet".to_string()),
    }
}

fn stateful_set(object: &Value) -> Verdict {
    if let Some(verdict) = not_yet_observed(object, "statefulset") {
        return verdict;
    }
    let desired = int(object, "/spec/replicas").unwrap_or(1);
    let replicas = count(object, "/status/replicas");
    let ready = count(object, "/status/readyReplicas");
    let updated = count(object, "/status/updatedReplicas");
    let current = count(object, "/status/currentReplicas");
    if replicas < desired {
        return in_progress(format!("{replicas} of {desired} replicas created"));
    }
    if ready < desired {
        return in_progress(format!("{ready} of {desired} replicas ready"));
    }
    if replicas > desired {
        return in_progress(format!(
            "{} pending termination",
            plural(replicas - desired, "extra replica", "extra replicas")
        ));
    }
    // OnDelete: Pods take a new revision only when someone deletes them, so there is no
    // rollout to wait for; but (unlike kstatus) the Pods must be ready.
    if text(object, "/spec/updateStrategy/type") == Some("OnDelete") {
        return Verdict::Ready;
    }
    let update_revision = text(object, "/status/updateRevision").unwrap_or_default();
    if let Some(partition) = int(object, "/spec/updateStrategy/rollingUpdate/partition") {
        // Only Pods with an ordinal >= partition are updated.
        let target = (desired - partition.max(0)).max(0);
        if updated < target {
            return in_progress(if partition > 0 {
                format!("{updated} of {target} replicas updated (partition {partition})")
            } else {
                format!("{updated} of {target} replicas updated")
            });
        }
        return Verdict::Ready;
    }
    if current < desired {
        return in_progress(format!(
            "{current} of {desired} replicas at the current revision"
        ));
    }
    let current_revision = text(object, "/status/currentRevision").unwrap_or_default();
    if current_revision != update_revision {
        return in_progress(format!(
            "rolling update to revision {update_revision} not finished (current revision {current_revision}, {updated} of {desired} replicas updated)"
        ));
    }
    Verdict::Ready
}

fn daemon_set(object: &Value) -> Verdict {
    if let Some(verdict) = not_yet_observed(object, "daemonset") {
        return verdict;
    }
    let Some(desired) = int(object, "/status/desiredNumberScheduled") else {
        return in_progress("the number of nodes to run on is not known yet");
    };
    let scheduled = count(object, "/status/currentNumberScheduled");
    let updated = count(object, "/status/updatedNumberScheduled");
    let available = count(object, "/status/numberAvailable");
    let ready = count(object, "/status/numberReady");
    if scheduled < desired {
        return in_progress(format!("{scheduled} of {desired} pods scheduled"));
    }
    // OnDelete: Pods are replaced only when someone deletes them.
    let on_delete = text(object, "/spec/updateStrategy/type") == Some("OnDelete");
    if !on_delete && updated < desired {
        return in_progress(format!("{updated} of {desired} pods updated"));
    }
    if available < desired {
        return in_progress(format!("{available} of {desired} pods available"));
    }
    if ready < desired {
        return in_progress(format!("{ready} of {desired} pods ready"));
    }
    Verdict::Ready
}

fn replica_set(object: &Value) -> Verdict {
    if let Some(verdict) = not_yet_observed(object, "replicaset") {
        return verdict;
    }
    // kstatus keeps this in progress: quotas and admission can let the Pods in later.
    if let Some(c) = condition(object, "ReplicaFailure").filter(Condition::is_true) {
        return in_progress(format!("cannot create pods{}", c.in_parentheses()));
    }
    let desired = int(object, "/spec/replicas").unwrap_or(1);
    let replicas = count(object, "/status/replicas");
    let labelled = count(object, "/status/fullyLabeledReplicas");
    let available = count(object, "/status/availableReplicas");
    let ready = count(object, "/status/readyReplicas");
    if labelled < desired {
        return in_progress(format!(
            "{labelled} of {desired} replicas created with the template's labels"
        ));
    }
    if available < desired {
        return in_progress(format!("{available} of {desired} replicas available"));
    }
    if ready < desired {
        return in_progress(format!("{ready} of {desired} replicas ready"));
    }
    if replicas > desired {
        return in_progress(format!(
            "{} pending termination",
            plural(replicas - desired, "extra replica", "extra replicas")
        ));
    }
    Verdict::Ready
}

fn job(object: &Value) -> Verdict {
    // FailureTarget is set before Failed, once the failure is decided and Pods are being
    // terminated; both are final.
    for kind in ["Failed", "FailureTarget"] {
        if let Some(c) = condition(object, kind).filter(Condition::is_true) {
            return failed(format!("failed{}", c.in_parentheses()));
        }
    }
    if condition(object, "Complete").is_some_and(|c| c.is_true()) {
        return Verdict::Ready;
    }
    if flag(object, "/spec/suspend") {
        return in_progress("suspended (spec.suspend is true); it completes only once resumed");
    }
    if text(object, "/status/startTime").is_none() {
        return in_progress("not started yet");
    }
    let succeeded = count(object, "/status/succeeded");
    let active = count(object, "/status/active");
    let failures = count(object, "/status/failed");
    let progress = match int(object, "/spec/completions") {
        Some(completions) => format!("{succeeded} of {completions} completions succeeded"),
        None => format!("{succeeded} pods succeeded"),
    };
    let mut pods = vec![format!("{active} active")];
    if failures > 0 {
        pods.push(format!("{failures} failed"));
    }
    in_progress(format!("running: {progress} ({})", pods.join(", ")))
}

/// A container status: its name and, when it waits or has terminated, why.
struct ContainerState<'a> {
    name: &'a str,
    init: bool,
    waiting: Option<(&'a str, &'a str)>,
    terminated: Option<(i64, &'a str, &'a str)>,
}

fn container_states<'a>(object: &'a Value, key: &str, init: bool) -> Vec<ContainerState<'a>> {
    let Some(items) = object
        .get("status")
        .and_then(|s| s.get(key))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    items
        .iter()
        .map(|c| {
            let field = |pointer: &str| c.pointer(pointer).and_then(Value::as_str).unwrap_or("");
            ContainerState {
                name: c.get("name").and_then(Value::as_str).unwrap_or("?"),
                init,
                waiting: c.pointer("/state/waiting").map(|_| {
                    (
                        field("/state/waiting/reason"),
                        field("/state/waiting/message"),
                    )
                }),
                terminated: c.pointer("/state/terminated").map(|_| {
                    (
                        int(c, "/state/terminated/exitCode").unwrap_or(0),
                        field("/state/terminated/reason"),
                        field("/state/terminated/message"),
                    )
                }),
            }
        })
        .collect()
}

impl ContainerState<'_> {
    fn label(&self) -> String {
        if self.init {
            format!("init container {}", self.name)
        } else {
            format!("container {}", self.name)
        }
    }
}

fn pod(object: &Value, completion: bool) -> Verdict {
    let phase = text(object, "/status/phase").unwrap_or_default();
    let mut containers = container_states(object, "initContainerStatuses", true);
    containers.extend(container_states(object, "containerStatuses", false));
    let waiting = || {
        containers.iter().find_map(|c| {
            c.waiting
                .filter(|(reason, _)| !reason.is_empty())
                .map(|(reason, message)| {
                    format!("{} waiting ({})", c.label(), detail(reason, message))
                })
        })
    };
    match phase {
        "Succeeded" => Verdict::Ready,
        "Failed" => {
            let pod_reason = detail(
                text(object, "/status/reason").unwrap_or_default(),
                text(object, "/status/message").unwrap_or_default(),
            );
            if !pod_reason.is_empty() {
                return failed(format!("failed ({pod_reason})"));
            }
            let exited = containers.iter().find_map(|c| {
                c.terminated
                    .filter(|(code, _, _)| *code != 0)
                    .map(|(code, reason, message)| {
                        let why = detail(reason, message);
                        if why.is_empty() {
                            format!("{} exited with code {code}", c.label())
                        } else {
                            format!("{} exited with code {code} ({why})", c.label())
                        }
                    })
            });
            failed(match exited {
                Some(exited) => format!("failed: {exited}"),
                None => "failed".to_string(),
            })
        }
        "Running" => {
            let crash_looping: Vec<&ContainerState<'_>> = containers
                .iter()
                .filter(|c| !c.init && c.waiting.is_some_and(|(r, _)| r == "CrashLoopBackOff"))
                .collect();
            let ready = condition(object, "Ready").is_some_and(|c| c.is_true());
            if ready && !completion {
                return Verdict::Ready;
            }
            if let Some(first) = crash_looping.first() {
                let message = first.waiting.map(|(_, m)| m).unwrap_or_default();
                let names: Vec<&str> = crash_looping.iter().map(|c| c.name).collect();
                return failed(format!(
                    "{} {} in CrashLoopBackOff{}",
                    if names.len() == 1 {
                        "container"
                    } else {
                        "containers"
                    },
                    names.join(", "),
                    if message.is_empty() {
                        String::new()
                    } else {
                        format!(" ({message})")
                    }
                ));
            }
            if completion {
                return in_progress("running; waiting for it to complete (phase Succeeded)");
            }
            match condition(object, "Ready") {
                Some(c) => in_progress(format!("running but not Ready{}", c.in_parentheses())),
                None => in_progress("running but not Ready"),
            }
        }
        "Pending" => {
            if let Some(c) = condition(object, "PodScheduled").filter(Condition::is_false) {
                return in_progress(format!("not scheduled{}", c.in_parentheses()));
            }
            if let Some(waiting) = waiting() {
                return in_progress(waiting);
            }
            in_progress("phase Pending")
        }
        "" => in_progress("not scheduled yet (no status.phase)"),
        other => in_progress(format!("phase {other}")),
    }
}

fn persistent_volume_claim(object: &Value) -> Verdict {
    match text(object, "/status/phase") {
        Some("Bound") => Verdict::Ready,
        Some("Lost") => failed("phase Lost: its PersistentVolume no longer exists"),
        Some(phase) => in_progress(format!("phase {phase}, not Bound")),
        None => in_progress("no phase yet, not Bound"),
    }
}

fn service(object: &Value) -> Verdict {
    if text(object, "/spec/type") != Some("LoadBalancer") {
        return Verdict::Ready;
    }
    let assigned = object
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .is_some_and(|ingress| !ingress.is_empty());
    if assigned {
        Verdict::Ready
    } else {
        in_progress(
            "type LoadBalancer, no ingress assigned yet (status.loadBalancer.ingress is empty)",
        )
    }
}

fn custom_resource_definition(object: &Value) -> Verdict {
    if let Some(c) = condition(object, "NamesAccepted").filter(Condition::is_false) {
        return failed(format!("names not accepted{}", c.in_parentheses()));
    }
    match condition(object, "Established") {
        Some(c) if c.is_true() => Verdict::Ready,
        Some(c) if c.is_false() && c.reason != "Installing" => {
            failed(format!("not established{}", c.in_parentheses()))
        }
        Some(c) => in_progress(format!("not established yet{}", c.in_parentheses())),
        None => in_progress("not established yet"),
    }
}

/// Kinds that have no status at all: with no readiness rules of their own, an object of one is
/// ready once it exists and is not being deleted, so its metadata is all that needs reading.
pub(crate) fn ready_once_it_exists(group: &str, kind: &str) -> bool {
    matches!(
        (group, kind),
        (
            "",
            "ConfigMap" | "Secret" | "ServiceAccount" | "Endpoints" | "LimitRange"
        ) | (
            "rbac.authorization.k8s.io",
            "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding"
        ) | ("scheduling.k8s.io", "PriorityClass")
            | ("storage.k8s.io", "StorageClass")
            | (
                "admissionregistration.k8s.io",
                "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration"
            )
    )
}

/// Any other kind: a `Failed` condition is a failure, a `Ready` condition decides, and an
/// object without either is ready once it exists.
fn generic(object: &Value) -> Verdict {
    if let Some(c) = condition(object, "Failed").filter(Condition::is_true) {
        return failed(format!("failed{}", c.in_parentheses()));
    }
    let Some(ready) = condition(object, "Ready") else {
        return Verdict::Ready;
    };
    // A Ready condition written for an older generation (metav1.Condition.observedGeneration).
    if let (Some(observed), Some(generation)) = (
        ready.observed_generation,
        int(object, "/metadata/generation"),
    ) && observed < generation
    {
        return in_progress(format!(
            "Ready condition is for generation {observed}, not yet for generation {generation}"
        ));
    }
    match ready.status {
        "True" => Verdict::Ready,
        status => in_progress(format!(
            "Ready is {}{}",
            if status.is_empty() { "not set" } else { status },
            ready.in_parentheses()
        )),
    }
}
