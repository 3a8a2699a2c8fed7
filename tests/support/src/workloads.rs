//! kube-controller-manager's Job controller and the kubelet, played for hook Jobs and Pods:
//! statuses written through the server's status subresource in the shape recorded from a real
//! cluster (tests/apiserver-recordings/requests-lifecycle.json, `job-ok-status` and
//! `job-bad-status`). Merge patches: a field a real controller drops is written as null.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::api::Api;
use serde_json::{Value, json};

use crate::apiserver::TestApiServer;
use crate::operator::{Kubelet, Operator};

/// The label that makes the emulated Job or Pod fail instead of succeed.
pub const OUTCOME_LABEL: &str = "sequenced.test/outcome";

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

/// As `job-bad-status`: FailureTarget and Failed with BackoffLimitExceeded, one failed.
fn job_failed_status(started: &str) -> Value {
    let at = now();
    let limit = "Job has reached the specified backoff limit";
    json!({
        "conditions": [
            condition("FailureTarget", "BackoffLimitExceeded", limit, &at),
            condition("Failed", "BackoffLimitExceeded", limit, &at),
        ],
        "startTime": started, "failed": 1, "active": null, "terminating": 0,
        "uncountedTerminatedPods": {}, "ready": 0
    })
}

/// A Pod's status as the kubelet writes it in `phase` (`Running`, `Succeeded`, `Failed`).
fn pod_status(object: &Value, phase: &str) -> Value {
    let at = now();
    let container = object
        .pointer("/spec/containers/0/name")
        .and_then(Value::as_str)
        .unwrap_or("main");
    let (ready, state) = match phase {
        "Running" => (true, json!({"running": {"startedAt": at}})),
        "Succeeded" => (
            false,
            json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": at, "finishedAt": at}}),
        ),
        _ => (
            false,
            json!({"terminated": {"exitCode": 1, "reason": "Error", "startedAt": at, "finishedAt": at}}),
        ),
    };
    let ready_condition = if ready {
        json!({"type": "Ready", "status": "True", "lastTransitionTime": at})
    } else {
        json!({"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": at})
    };
    json!({
        "phase": phase,
        "startTime": at,
        "conditions": [ready_condition],
        "containerStatuses": [{"name": container, "ready": ready, "restartCount": 0,
                               "started": ready, "state": state}]
    })
}

fn job_start(server: &TestApiServer, namespace: &str, name: &str) -> Option<String> {
    let object = server.object("batch/v1", "Job", Some(namespace), name)?;
    Some(
        object
            .pointer("/status/startTime")
            .and_then(Value::as_str)
            .map_or_else(now, str::to_string),
    )
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
    match server.object("v1", "Pod", Some(namespace), name) {
        Some(object) => server.set_status(
            "v1",
            "Pod",
            Some(namespace),
            name,
            pod_status(&object, phase),
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
    let terminal_phase = matches!(
        object.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    );
    terminal_condition || terminal_phase
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

    /// Runs every Job, and every Pod that runs to completion (`restartPolicy` Never or
    /// OnFailure), until the guard drops: running at once, then `delay` after it was first seen
    /// (by uid, so an object created again starts over) succeeded, or failed when labelled
    /// [`OUTCOME_LABEL`]`: fail`.
    pub fn job_controller(&self, delay: Duration) -> Kubelet {
        let server = self.server.clone();
        let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::all(self.server.client());
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::all(self.server.client());
        let handle = tokio::spawn(async move {
            let mut seen: HashMap<String, Instant> = HashMap::new();
            loop {
                let mut found: Vec<(&str, String, String)> = Vec::new();
                if let Ok(list) = jobs.list(&Default::default()).await {
                    found.extend(list.items.iter().map(|j| {
                        let m = &j.metadata;
                        (
                            "Job",
                            m.namespace.clone().unwrap_or_default(),
                            m.name.clone().unwrap_or_default(),
                        )
                    }));
                }
                if let Ok(list) = pods.list(&Default::default()).await {
                    found.extend(
                        list.items
                            .iter()
                            .filter(|p| {
                                p.spec
                                    .as_ref()
                                    .and_then(|s| s.restart_policy.as_deref())
                                    .is_some_and(|r| r == "Never" || r == "OnFailure")
                            })
                            .map(|p| {
                                let m = &p.metadata;
                                (
                                    "Pod",
                                    m.namespace.clone().unwrap_or_default(),
                                    m.name.clone().unwrap_or_default(),
                                )
                            }),
                    );
                }
                for (kind, namespace, name) in found {
                    let api_version = if kind == "Job" { "batch/v1" } else { "v1" };
                    let Some(object) = server.object(api_version, kind, Some(&namespace), &name)
                    else {
                        continue;
                    };
                    if finished(&object) {
                        continue;
                    }
                    let uid = object["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    let first = *seen.entry(uid).or_insert_with(Instant::now);
                    let done = first.elapsed() >= delay;
                    match (kind, done, fails(&object)) {
                        ("Job", false, _) => {
                            if object.pointer("/status/startTime").is_none() {
                                write_job(&server, &namespace, &name, job_running_status);
                            }
                        }
                        ("Job", true, false) => {
                            write_job(&server, &namespace, &name, job_succeeded_status);
                        }
                        ("Job", true, true) => {
                            write_job(&server, &namespace, &name, job_failed_status);
                        }
                        (_, false, _) => {
                            if object.pointer("/status/phase").and_then(Value::as_str)
                                != Some("Running")
                            {
                                write_pod(&server, &namespace, &name, "Running");
                            }
                        }
                        (_, true, false) => {
                            write_pod(&server, &namespace, &name, "Succeeded");
                        }
                        (_, true, true) => {
                            write_pod(&server, &namespace, &name, "Failed");
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Kubelet::from(handle)
    }
}
