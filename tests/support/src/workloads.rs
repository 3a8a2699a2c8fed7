//! kube-controller-manager's Job controller and the kubelet, played for hook Jobs and Pods.
//!
//! [`TestApiServer::job_controller`] runs both until its guard drops, talking to the server as
//! they would (requests recorded as client `job-controller`):
//! - The Job controller creates each Job's Pod through the API, as kube-controller-manager
//!   does (`generateName: JOB-`, the template's labels and annotations plus the Job's
//!   controller-uid and job-name labels, a controller owner reference to the Job, the
//!   template's spec). The server's admission may refuse it, e.g. with the 403 of a missing
//!   ServiceAccount: the controller then records a Warning Event `FailedCreate` on the Job
//!   (counted up on each retry), leaves the Job started with no active Pod and no condition,
//!   and tries again with a backoff (10 ms, doubling, at most 200 ms) until the Pod is
//!   created: recorded in tests/apiserver-recordings/serviceaccount-missing.json.
//! - The kubelet runs each Pod that runs to completion (`restartPolicy` Never or OnFailure):
//!   Running when first seen, then `delay` later Succeeded, or Failed when the Pod or its Job
//!   is labelled [`OUTCOME_LABEL`]`: fail`. What a container writes comes from the Pod's
//!   annotations ([`LOG_ANNOTATION`]), served by `GET .../pods/NAME/log`.
//!   [`TestApiServer::job_controller_running_scripts`] also reads what a container would do
//!   from its command when it is a `sh -c` script of `echo` lines and an `exit N` (see
//!   [`script`]): the echoed lines are its log and a non-zero exit fails the Pod, so a chart
//!   written for a real cluster (a migration that prints an error and exits 1) behaves the same
//!   here without test labels. The label and the annotation still win over the script.
//! - The Job controller writes the Job's status from its Pods, in the shape recorded from a
//!   real cluster (requests-lifecycle.json, `job-ok-status` and `job-bad-status`): Complete
//!   when its Pod succeeded, Failed (BackoffLimitExceeded) once more Pods failed than
//!   `backoffLimit` allows, a new Pod after each failure until then. One Pod at a time and
//!   one completion, whatever `parallelism` and `completions` say; suspended Jobs are left
//!   alone; no `batch.kubernetes.io/job-tracking` finalizer on the Pods.
//!
//! Statuses are merge patches through the server's status writes (no request): a field a
//! real controller drops is written as null.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::apiserver::TestApiServer;
use crate::operator::{Kubelet, Operator};

/// The label that makes the emulated Job or Pod fail instead of succeed.
pub const OUTCOME_LABEL: &str = "sequenced.test/outcome";

/// The annotation whose text the played kubelet gives as the log of a Pod's first container
/// (`sequenced.test/log.NAME`: of container NAME). A Job's template annotations are its Pod's.
pub const LOG_ANNOTATION: &str = "sequenced.test/log";

/// The first wait after a refused Pod create, doubled after each refusal up to the cap.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// Who records the Job's events, as in `job-failedcreate-event`.
const COMPONENT: &str = "job-controller";

/// Now, as the API server writes times: RFC 3339 in whole seconds.
fn now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn condition(type_: &str, reason: &str, message: &str, at: &str) -> Value {
    json!({"type": type_, "status": "True", "lastProbeTime": at, "lastTransitionTime": at,
           "reason": reason, "message": message})
}

/// The Job's status while its Pod runs: started, one active, no condition.
fn job_running_status(started: &str) -> Value {
    json!({"startTime": started, "active": 1, "ready": 0, "terminating": 0,
           "uncountedTerminatedPods": {}})
}

/// As `job-ok-status`: SuccessCriteriaMet and Complete, one succeeded.
fn job_succeeded_status(started: &str) -> Value {
    let at = now();
    let reached = "Reached expected number of succeeded pods";
    json!({
        "conditions": [
            condition("SuccessCriteriaMet", "CompletionsReached", reached, &at),
            condition("Complete", "CompletionsReached", reached, &at),
        ],
        "startTime": started, "completionTime": at, "succeeded": 1, "active": null,
        "terminating": 0, "uncountedTerminatedPods": {}, "ready": 0
    })
}

/// As `job-bad-status`: FailureTarget and Failed with BackoffLimitExceeded, `failed` failed.
fn job_failed_after(started: &str, failed: usize) -> Value {
    let at = now();
    let limit = "Job has reached the specified backoff limit";
    json!({
        "conditions": [
            condition("FailureTarget", "BackoffLimitExceeded", limit, &at),
            condition("Failed", "BackoffLimitExceeded", limit, &at),
        ],
        "startTime": started, "failed": failed, "active": null, "terminating": 0,
        "uncountedTerminatedPods": {}, "ready": 0
    })
}

fn job_failed_status(started: &str) -> Value {
    job_failed_after(started, 1)
}

/// A hex container id for a container of a Pod, as the runtime would give it.
fn container_id(pod_uid: &str, container: &str) -> String {
    let state =
        std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
    let h = std::hash::BuildHasher::hash_one(&state, (pod_uid, container));
    format!("containerd://{}{h:016x}", pod_uid.replace('-', ""))
}

fn container_names(pod: &Value) -> Vec<String> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str).map(String::from))
        .collect()
}

/// A Pod's status as the kubelet writes it in `phase` (`Running`, `Succeeded`, `Failed`), where
/// a failed container exited with `exit_code`. Public for the demo, which plays the kubelet on a
/// cluster without Nodes.
pub fn pod_status_exiting(object: &Value, phase: &str, exit_code: i32) -> Value {
    let at = now();
    let uid = object
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    let ready = phase == "Running";
    let state = match phase {
        "Running" => json!({"running": {"startedAt": at}}),
        "Succeeded" => {
            json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": at, "finishedAt": at}})
        }
        _ => {
            json!({"terminated": {"exitCode": exit_code, "reason": "Error", "startedAt": at, "finishedAt": at}})
        }
    };
    let mut names = container_names(object);
    if names.is_empty() {
        names.push("main".into());
    }
    let statuses: Vec<Value> = names
        .iter()
        .map(|name| {
            let id = container_id(uid, name);
            let mut state = state.clone();
            if let Some(t) = state.get_mut("terminated") {
                t["containerID"] = json!(id);
            }
            json!({"name": name, "ready": ready, "restartCount": 0, "started": ready,
                   "containerID": id, "state": state})
        })
        .collect();
    let ready_condition = if ready {
        json!({"type": "Ready", "status": "True", "lastTransitionTime": at})
    } else {
        json!({"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": at})
    };
    json!({
        "phase": phase,
        "startTime": at,
        "conditions": [ready_condition],
        "containerStatuses": statuses
    })
}

fn job_start(server: &TestApiServer, namespace: &str, name: &str) -> Option<String> {
    let object = server.object("batch/v1", "Job", Some(namespace), name)?;
    Some(started(&object))
}

fn started(job: &Value) -> String {
    job.pointer("/status/startTime")
        .and_then(Value::as_str)
        .map_or_else(now, str::to_string)
}

fn write_job(
    server: &TestApiServer,
    namespace: &str,
    name: &str,
    status: fn(&str) -> Value,
) -> bool {
    match job_start(server, namespace, name) {
        Some(started) => {
            server.set_status("batch/v1", "Job", Some(namespace), name, status(&started))
        }
        None => false,
    }
}

fn write_pod(server: &TestApiServer, namespace: &str, name: &str, phase: &str) -> bool {
    write_pod_exiting(server, namespace, name, phase, 1)
}

fn write_pod_exiting(
    server: &TestApiServer,
    namespace: &str,
    name: &str,
    phase: &str,
    exit_code: i32,
) -> bool {
    match server.object("v1", "Pod", Some(namespace), name) {
        Some(object) => server.set_status(
            "v1",
            "Pod",
            Some(namespace),
            name,
            pod_status_exiting(&object, phase, exit_code),
        ),
        None => false,
    }
}

/// Whether an object is labelled to fail.
fn fails(object: &Value) -> bool {
    object
        .pointer("/metadata/labels")
        .and_then(|l| l.get(OUTCOME_LABEL))
        .and_then(Value::as_str)
        == Some("fail")
}

/// Whether a Job has a terminal condition, or a Pod a terminal phase.
fn finished(object: &Value) -> bool {
    let terminal_condition = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter().any(|c| {
                matches!(c["type"].as_str(), Some("Complete" | "Failed")) && c["status"] == "True"
            })
        });
    terminal_condition || matches!(phase(object), "Succeeded" | "Failed")
}

fn phase(pod: &Value) -> &str {
    pod.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn deleting(object: &Value) -> bool {
    object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

fn meta<'a>(object: &'a Value, field: &str) -> &'a str {
    object
        .pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The uid of the object's controller, from its owner references.
fn controller_uid(object: &Value) -> Option<&str> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r["controller"] == true)
        .and_then(|r| r["uid"].as_str())
}

/// Whether the Pod runs to completion, as a Job's Pods and hook Pods do.
pub fn runs_to_completion(pod: &Value) -> bool {
    matches!(
        pod.pointer("/spec/restartPolicy").and_then(Value::as_str),
        Some("Never" | "OnFailure")
    )
}

impl Operator {
    /// Plays the Job controller: the Job's Pod runs. False when the Job does not exist.
    pub fn job_running(&self, namespace: &str, name: &str) -> bool {
        write_job(&self.server, namespace, name, job_running_status)
    }

    /// The Job's only Pod succeeded: Complete, as `job-ok-status`.
    pub fn job_succeeded(&self, namespace: &str, name: &str) -> bool {
        write_job(&self.server, namespace, name, job_succeeded_status)
    }

    /// The Job's only Pod failed (backoffLimit 0): Failed, as `job-bad-status`.
    pub fn job_failed(&self, namespace: &str, name: &str) -> bool {
        write_job(&self.server, namespace, name, job_failed_status)
    }

    /// Plays the kubelet: the Pod is in `phase` (`Running`, `Succeeded`, `Failed`).
    pub fn pod_phase(&self, namespace: &str, name: &str, phase: &str) -> bool {
        write_pod(&self.server, namespace, name, phase)
    }

    /// [`TestApiServer::job_controller`] on the operator's server.
    pub fn job_controller(&self, delay: Duration) -> Kubelet {
        self.server.job_controller(delay)
    }
}

impl TestApiServer {
    /// Plays kube-controller-manager's Job controller and the kubelet (see the module's
    /// documentation) until the guard drops: every Job gets a Pod, every Pod that runs to
    /// completion runs, Running at once and finished `delay` after it was first seen (by uid,
    /// so an object created again starts over), and each Job's status follows its Pods.
    pub fn job_controller(&self, delay: Duration) -> Kubelet {
        self.played_job_controller(delay, false)
    }

    /// [`TestApiServer::job_controller`] whose kubelet also runs the `sh -c` scripts it
    /// understands ([`script`]): their `echo` lines are the container's log and their `exit`
    /// decides whether the Pod succeeds. A Pod labelled [`OUTCOME_LABEL`] or annotated
    /// [`LOG_ANNOTATION`] is played by its label and annotation, as by `job_controller`; a
    /// command it does not understand succeeds with no log.
    pub fn job_controller_running_scripts(&self, delay: Duration) -> Kubelet {
        self.played_job_controller(delay, true)
    }

    fn played_job_controller(&self, delay: Duration, scripts: bool) -> Kubelet {
        let mut played = Played {
            server: self.clone(),
            client: self.client_as(COMPONENT),
            delay,
            scripts,
            seen: HashMap::new(),
            retries: HashMap::new(),
        };
        let handle = tokio::spawn(async move {
            loop {
                played.pass().await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        Kubelet::from(handle)
    }
}

/// Why a Job has no Pod yet: when to try again, and the FailedCreate event recorded.
struct Retry {
    next: Instant,
    backoff: Duration,
    /// The event's name, count and message.
    event: Option<(String, i64, String)>,
}

struct Played {
    server: TestApiServer,
    client: kube::Client,
    delay: Duration,
    /// Whether `sh -c` scripts decide the log and the outcome ([`script`]).
    scripts: bool,
    /// When each Pod (by uid) was first seen by the kubelet.
    seen: HashMap<String, Instant>,
    /// By Job uid.
    retries: HashMap<String, Retry>,
}

impl Played {
    async fn list(&self, api_version: &str, kind: &str, plural: &str) -> Vec<Value> {
        let resource = crate::api_resource(api_version, kind, plural);
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
        match api.list(&Default::default()).await {
            Ok(list) => list
                .items
                .iter()
                .filter_map(|o| serde_json::to_value(o).ok())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    async fn pass(&mut self) {
        let pods = self.list("v1", "Pod", "pods").await;
        for pod in &pods {
            self.kubelet(meta(pod, "namespace"), meta(pod, "name"));
        }
        let jobs = self.list("batch/v1", "Job", "jobs").await;
        for job in &jobs {
            self.job(meta(job, "namespace"), meta(job, "name")).await;
        }
    }

    /// The kubelet's part for one Pod.
    fn kubelet(&mut self, namespace: &str, name: &str) {
        let server = &self.server;
        let Some(pod) = server.object("v1", "Pod", Some(namespace), name) else {
            return;
        };
        if !runs_to_completion(&pod) || finished(&pod) || deleting(&pod) {
            return;
        }
        let uid = meta(&pod, "uid").to_string();
        let first = match self.seen.get(&uid) {
            Some(at) => *at,
            None => {
                self.seen.insert(uid, Instant::now());
                write_logs(server, &pod, self.scripts);
                Instant::now()
            }
        };
        if first.elapsed() < self.delay {
            if phase(&pod) != "Running" {
                write_pod(server, namespace, name, "Running");
            }
            return;
        }
        let job_fails = pod
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|r| r["kind"] == "Job" && r["controller"] == true)
            .filter_map(|r| r["name"].as_str())
            .filter_map(|job| server.object("batch/v1", "Job", Some(namespace), job))
            .any(|job| fails(&job));
        if fails(&pod) || job_fails {
            write_pod(server, namespace, name, "Failed");
            return;
        }
        let exit_code = if self.scripts {
            container_scripts(&pod)
                .into_iter()
                .filter_map(|(_, script)| script.map(|s| s.exit_code))
                .find(|&code| code != 0)
                .unwrap_or(0)
        } else {
            0
        };
        if exit_code == 0 {
            write_pod(server, namespace, name, "Succeeded");
        } else {
            write_pod_exiting(server, namespace, name, "Failed", exit_code);
        }
    }

    /// The Job controller's part for one Job.
    async fn job(&mut self, namespace: &str, name: &str) {
        let Some(job) = self.server.object("batch/v1", "Job", Some(namespace), name) else {
            return;
        };
        let suspended = job.pointer("/spec/suspend") == Some(&json!(true));
        if finished(&job) || deleting(&job) || suspended {
            return;
        }
        let uid = meta(&job, "uid").to_string();
        let pods: Vec<Value> = self
            .list_namespaced_pods(namespace)
            .into_iter()
            .filter(|p| controller_uid(p) == Some(uid.as_str()) && !deleting(p))
            .collect();
        let count = |p: &str| pods.iter().filter(|pod| phase(pod) == p).count();
        let (succeeded, failed) = (count("Succeeded"), count("Failed"));
        let active: Vec<&Value> = pods.iter().filter(|p| !finished(p)).collect();
        let started = started(&job);
        let limit = job
            .pointer("/spec/backoffLimit")
            .and_then(Value::as_u64)
            .unwrap_or(6) as usize;
        if succeeded > 0 {
            self.retries.remove(&uid);
            let mut status = job_succeeded_status(&started);
            if failed > 0 {
                status["failed"] = json!(failed);
            }
            self.status(&job, status);
            self.event(&job, "Normal", "Completed", "Job completed")
                .await;
            return;
        }
        if failed > limit {
            self.retries.remove(&uid);
            self.status(&job, job_failed_after(&started, failed));
            let message = "Job has reached the specified backoff limit";
            self.event(&job, "Warning", "BackoffLimitExceeded", message)
                .await;
            return;
        }
        let failed_count = if failed > 0 {
            json!(failed)
        } else {
            Value::Null
        };
        if !active.is_empty() {
            let ready = active
                .iter()
                .filter(|p| {
                    p.pointer("/status/conditions")
                        .and_then(Value::as_array)
                        .is_some_and(|c| {
                            c.iter()
                                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                        })
                })
                .count();
            let mut status = job_running_status(&started);
            status["active"] = json!(active.len());
            status["ready"] = json!(ready);
            status["failed"] = failed_count;
            self.status(&job, status);
            return;
        }
        let retry = self.retries.entry(uid).or_insert_with(|| Retry {
            next: Instant::now(),
            backoff: FIRST_BACKOFF,
            event: None,
        });
        if Instant::now() < retry.next {
            return;
        }
        match self.create_pod(&job).await {
            Ok(pod) => {
                let mut status = job_running_status(&started);
                status["failed"] = failed_count;
                self.status(&job, status);
                let message = format!("Created pod: {pod}");
                self.event(&job, "Normal", "SuccessfulCreate", &message)
                    .await;
            }
            Err(refusal) => {
                let message = format!("Error creating: {refusal}");
                self.failed_create(&job, &message).await;
                // Started, nothing active, no condition: as `job-without-its-serviceaccount`.
                let status = json!({"startTime": started, "active": null, "ready": 0,
                                    "terminating": 0, "uncountedTerminatedPods": {},
                                    "failed": failed_count});
                self.status(&job, status);
            }
        }
    }

    fn list_namespaced_pods(&self, namespace: &str) -> Vec<Value> {
        self.server.objects("v1", "Pod", Some(namespace))
    }

    /// Creates the Job's Pod as the Job controller does; its name, or why it was refused.
    async fn create_pod(&self, job: &Value) -> Result<String, String> {
        let (namespace, name, uid) = (meta(job, "namespace"), meta(job, "name"), meta(job, "uid"));
        let template = job.pointer("/spec/template").cloned().unwrap_or(json!({}));
        let mut labels = template
            .pointer("/metadata/labels")
            .cloned()
            .unwrap_or(json!({}));
        for (key, value) in [
            ("batch.kubernetes.io/controller-uid", uid),
            ("controller-uid", uid),
            ("batch.kubernetes.io/job-name", name),
            ("job-name", name),
        ] {
            labels[key] = json!(value);
        }
        let mut metadata = json!({
            "generateName": format!("{name}-"),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                 "uid": uid, "controller": true, "blockOwnerDeletion": true}],
        });
        if let Some(annotations) = template.pointer("/metadata/annotations") {
            metadata["annotations"] = annotations.clone();
        }
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": template.get("spec").cloned().unwrap_or(json!({})),
        });
        let pod: DynamicObject = serde_json::from_value(pod).map_err(|e| e.to_string())?;
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            namespace,
            &ApiResource::erase::<Pod>(&()),
        );
        match api.create(&PostParams::default(), &pod).await {
            Ok(created) => Ok(created.metadata.name.unwrap_or_default()),
            Err(kube::Error::Api(status)) => Err(status.message.clone()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Merges `status` into the Job's when it would change something.
    fn status(&self, job: &Value, status: Value) {
        let current = job.get("status").cloned().unwrap_or(json!({}));
        let changes = status.as_object().is_some_and(|m| {
            m.iter().any(|(k, v)| match current.get(k) {
                None => !v.is_null(),
                Some(c) => c != v && !(k == "conditions" && c.is_array()),
            })
        });
        if changes {
            self.server.set_status(
                "batch/v1",
                "Job",
                Some(meta(job, "namespace")),
                meta(job, "name"),
                status,
            );
        }
    }

    /// The Job's FailedCreate event: recorded once, then counted up on each retry with the
    /// same message; the next try after a longer wait.
    async fn failed_create(&mut self, job: &Value, message: &str) {
        let uid = meta(job, "uid").to_string();
        let previous = self.retries.get(&uid).and_then(|r| r.event.clone());
        let event = match previous {
            Some((event, count, last)) if last == message => {
                let patch = json!({"count": count + 1, "lastTimestamp": now()});
                let api: Api<k8s_openapi::api::core::v1::Event> =
                    Api::namespaced(self.client.clone(), meta(job, "namespace"));
                let patched = api
                    .patch(&event, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                match patched {
                    Ok(_) => Some((event, count + 1, last)),
                    Err(_) => None,
                }
            }
            _ => self
                .event(job, "Warning", "FailedCreate", message)
                .await
                .map(|name| (name, 1, message.to_string())),
        };
        if let Some(retry) = self.retries.get_mut(&uid) {
            retry.event = event;
            retry.next = Instant::now() + retry.backoff;
            retry.backoff = (retry.backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Records an Event about the Job as client-go's recorder does (core/v1, count 1); its
    /// name.
    async fn event(&self, job: &Value, type_: &str, reason: &str, message: &str) -> Option<String> {
        let namespace = meta(job, "namespace");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let name = format!("{}.{nanos:x}", meta(job, "name"));
        let at = now();
        let event = json!({
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": meta(job, "name"),
                               "namespace": namespace, "resourceVersion": meta(job, "resourceVersion"),
                               "uid": meta(job, "uid")},
            "reason": reason, "message": message, "type": type_,
            "source": {"component": COMPONENT},
            "firstTimestamp": at, "lastTimestamp": at, "count": 1, "eventTime": null,
            "reportingComponent": COMPONENT, "reportingInstance": "",
        });
        let event: k8s_openapi::api::core::v1::Event = serde_json::from_value(event).ok()?;
        let api: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.client.clone(), namespace);
        api.create(&PostParams::default(), &event).await.ok()?;
        Some(name)
    }
}

/// The played kubelet writes what the Pod's annotations say its containers print, else (with
/// `scripts`) what their `sh -c` scripts echo.
fn write_logs(server: &TestApiServer, pod: &Value, scripts: bool) {
    let names = container_names(pod);
    let annotations = pod
        .pointer("/metadata/annotations")
        .and_then(Value::as_object);
    let mut scripted = if scripts {
        container_scripts(pod).into_iter().collect()
    } else {
        HashMap::new()
    };
    for (i, container) in names.iter().enumerate() {
        let own = format!("{LOG_ANNOTATION}.{container}");
        let annotated = annotations.and_then(|a| {
            a.get(&own)
                .or_else(|| a.get(LOG_ANNOTATION).filter(|_| i == 0))
                .and_then(Value::as_str)
        });
        let text = match annotated {
            Some(text) => Some(text.to_string()),
            None => scripted.remove(container).flatten().map(|s| s.log),
        };
        if let Some(text) = text {
            server.set_log(meta(pod, "namespace"), meta(pod, "name"), container, &text);
        }
    }
}

/// What a container's `sh -c` script does, as far as [`script`] understands it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// The lines it echoes, each ending with a newline.
    pub log: String,
    /// Its exit code: that of its `exit N`, else 0.
    pub exit_code: i32,
}

/// Each container of the Pod, by name, with what its command does (None: not a script
/// [`script`] understands).
pub fn container_scripts(pod: &Value) -> Vec<(String, Option<Script>)> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let name = c.get("name").and_then(Value::as_str)?;
            let words: Vec<&str> = ["command", "args"]
                .iter()
                .filter_map(|field| c.get(*field).and_then(Value::as_array))
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            Some((name.to_string(), script(&words)))
        })
        .collect()
}

/// Reads a container's command (its `command` then its `args`) as a shell would run it, when it
/// is `sh -c SCRIPT` (or `/bin/sh`, `bash`) and SCRIPT is statements separated by `;` or new
/// lines, each `echo WORDS` (words plain or quoted, `>&2` allowed), `true`, `:` or `exit N`.
/// Nothing else is understood (no variables, pipes, globs, conditions or other commands): such
/// a command gives None, and the played kubelet does not pretend to know what it prints.
pub fn script(command: &[&str]) -> Option<Script> {
    let [shell, flag, text] = command else {
        return None;
    };
    let shell = shell.rsplit('/').next().unwrap_or(shell);
    if !matches!(shell, "sh" | "bash" | "ash" | "dash") || *flag != "-c" {
        return None;
    }
    let mut log = String::new();
    for statement in statements(text)? {
        let words: Vec<&str> = statement
            .iter()
            .map(String::as_str)
            .filter(|w| !matches!(*w, ">&2" | "1>&2"))
            .collect();
        match words.as_slice() {
            [] | ["true"] | [":"] => {}
            ["echo", rest @ ..] => {
                if rest.first().is_some_and(|w| w.starts_with('-')) {
                    return None;
                }
                log.push_str(&rest.join(" "));
                log.push('\n');
            }
            ["exit"] => return Some(Script { log, exit_code: 0 }),
            ["exit", code] => {
                let exit_code = code.parse::<u8>().ok()?;
                return Some(Script {
                    log,
                    exit_code: i32::from(exit_code),
                });
            }
            _ => return None,
        }
    }
    Some(Script { log, exit_code: 0 })
}

/// The script's statements as words, quotes removed; None for anything [`script`] does not
/// understand.
fn statements(text: &str) -> Option<Vec<Vec<String>>> {
    let mut statements = vec![Vec::new()];
    let mut word: Option<String> = None;
    let mut chars = text.chars();
    let end_word = |word: &mut Option<String>, statements: &mut Vec<Vec<String>>| {
        if let (Some(w), Some(current)) = (word.take(), statements.last_mut()) {
            current.push(w);
        }
    };
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => end_word(&mut word, &mut statements),
            ';' | '\n' => {
                end_word(&mut word, &mut statements);
                statements.push(Vec::new());
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => w.push(c),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '"' => break,
                        '$' | '`' | '\\' => return None,
                        c => w.push(c),
                    }
                }
            }
            '$' | '`' | '\\' | '|' | '&' | '<' | '(' | ')' | '*' | '?' | '[' | ']' | '{' | '}'
            | '~' | '#' => {
                // `>&2` is a redirection to stderr, which the log shows too.
                if c == '&' && word.as_deref().is_some_and(|w| w.ends_with('>')) {
                    word.get_or_insert_with(String::new).push(c);
                } else {
                    return None;
                }
            }
            '>' => word.get_or_insert_with(String::new).push(c),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    end_word(&mut word, &mut statements);
    // Any other redirection is not understood.
    if statements
        .iter()
        .flatten()
        .any(|w| w.contains('>') && !matches!(w.as_str(), ">&2" | "1>&2"))
    {
        return None;
    }
    Some(statements)
}
