//! Readiness in CEL: what compiling an expression costs (done once per plan or spec) against
//! what judging an object with it costs (done at every check), next to the built-in rule of the
//! same object. The object is a Deployment as the API server returns it, `managedFields`
//! included.
//!
//! `cargo bench --bench readiness`.

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use sequenced::readiness::cel::{HealthCheck, HealthCheckText};
use sequenced::readiness::{self, Cel, Rules};
use serde_json::{Value, json};

const READY_WHEN: &str = "has(self.status) && has(self.status.availableReplicas) && \
    self.status.availableReplicas >= self.spec.replicas && \
    self.status.conditions.exists(c, c.type == 'Available' && c.status == 'True')";

/// A Deployment of three replicas, all available, with the managed fields a real one carries.
fn deployment() -> Value {
    let fields: Vec<Value> = (0..6)
        .map(|i| {
            json!({"manager": format!("manager-{i}"), "operation": "Update", "apiVersion": "apps/v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {".": {}}},
                "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:image": {}}}}}}}})
        })
        .collect();
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "generation": 4, "uid": "5f0c",
            "resourceVersion": "81723", "labels": {"app": "web", "app.kubernetes.io/managed-by": "sequenced"},
            "annotations": {"sequenced.dev/ready-when": READY_WHEN, "meta.helm.sh/release-name": "shop",
                "meta.helm.sh/release-namespace": "shop", "sequenced.dev/owner": "shop/shop"},
            "managedFields": fields},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                    "ports": [{"containerPort": 8080}], "resources": {"requests": {"cpu": "10m"}}}]}}},
        "status": {"observedGeneration": 4, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 3,
            "availableReplicas": 3,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}
    })
}

fn bench(c: &mut Criterion) {
    let object = deployment();
    c.bench_function("cel: compile a ready-when expression", |b| {
        b.iter(|| Cel::compile(std::hint::black_box(READY_WHEN)).unwrap())
    });
    let rules = Rules::from_object(&object).unwrap();
    assert!(readiness::check(&object, &rules, None, Duration::MAX).is_ready());
    c.bench_function("cel: judge a Deployment by its compiled ready-when", |b| {
        b.iter(|| readiness::check(std::hint::black_box(&object), &rules, None, Duration::MAX))
    });
    c.bench_function(
        "cel: read the rules and compile ready-when, then judge",
        |b| {
            b.iter(|| {
                let rules = Rules::from_object(std::hint::black_box(&object)).unwrap();
                readiness::check(&object, &rules, None, Duration::MAX)
            })
        },
    );
    let check = HealthCheck::compile(HealthCheckText {
        api_version: "apps/v1",
        kind: "Deployment",
        current: READY_WHEN,
        in_progress: Some("has(self.status) && self.status.observedGeneration < self.metadata.generation"),
        failed: Some("has(self.status) && self.status.conditions.exists(c, c.reason == 'ProgressDeadlineExceeded')"),
    })
    .unwrap();
    c.bench_function("cel: judge a Deployment by healthCheckExprs", |b| {
        b.iter(|| check.judge(std::hint::black_box(&object)))
    });
    let builtin = Rules::default();
    c.bench_function("built-in rule: judge the same Deployment", |b| {
        b.iter(|| readiness::check(std::hint::black_box(&object), &builtin, None, Duration::MAX))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
