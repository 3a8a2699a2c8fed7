//! The SequencedRelease CRD: generated, committed, structural, and rejecting bad specs the way an
//! API server would (OpenAPI checks and CEL rules).

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

const COPIES: [&str; 3] = [
    "crds/sequencedrelease.yaml",
    "charts/sequenced/crds/sequencedrelease.yaml",
    "deploy/sequencedrelease.yaml",
];

fn generated() -> String {
    sequenced::api::crd_yaml().expect("the CRD serializes")
}

#[test]
fn committed_crd_files_match_the_rust_types() {
    let expected = generated();
    for copy in COPIES {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(copy);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == expected,
            "{copy} differs from what src/api generates; run scripts/generate-crds.sh and commit the result"
        );
    }
}

#[test]
fn sequenced_crd_prints_the_committed_file() {
    let output = Command::new(env!("CARGO_BIN_EXE_sequenced"))
        .arg("crd")
        .output()
        .expect("run sequenced crd");
    assert!(output.status.success());
    let committed =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(COPIES[0])).unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), committed);
}

fn crd() -> Value {
    let text = generated();
    let body: String = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    sequenced::yaml::parse(&body).expect("the CRD is YAML")
}

fn schema() -> Value {
    crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

#[test]
fn names_scope_subresources_and_columns() {
    let crd = crd();
    assert_eq!(crd["metadata"]["name"], "sequencedreleases.sequenced.dev");
    assert_eq!(crd["spec"]["group"], "sequenced.dev");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(crd["spec"]["names"]["kind"], "SequencedRelease");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["sqr"]));
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert_eq!(version["served"], true);
    assert_eq!(version["storage"], true);
    assert_eq!(version["subresources"]["status"], json!({}));
    let columns: Vec<(String, i64)> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_uppercase(),
                c["priority"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    let wanted = [
        ("READY", 0),
        ("STATUS", 0),
        ("PHASE", 0),
        ("LAYER", 0),
        ("REVISION", 0),
        ("LOCKED TILL", 0),
        ("AGE", 0),
        ("SESSION", 1),
    ];
    for (name, priority) in wanted {
        assert!(
            columns.contains(&(name.to_string(), priority)),
            "missing column {name} (priority {priority}) in {columns:?}"
        );
    }
}

#[test]
fn every_spec_and_status_field_of_the_design_is_there() {
    let schema = schema();
    let spec = &schema["properties"]["spec"]["properties"];
    for field in [
        "chart",
        "releaseName",
        "targetNamespace",
        "createNamespace",
        "values",
        "valuesFrom",
        "sequencing",
        "timeout",
        "readinessTimeout",
        "wait",
        "onFailure",
        "retries",
        "dependsOn",
        "serviceAccountName",
        "suspend",
        "maxHistory",
        "uninstall",
        "adopt",
        "interval",
    ] {
        assert!(spec.get(field).is_some(), "spec.{field} is missing");
    }
    let chart = &spec["chart"]["properties"];
    for field in [
        "repository",
        "name",
        "version",
        "oci",
        "path",
        "configMapRef",
        "secretRef",
        "credentialsSecretRef",
    ] {
        assert!(chart.get(field).is_some(), "spec.chart.{field} is missing");
    }
    assert_eq!(
        spec["uninstall"]["properties"]["keepHistory"]["type"],
        "boolean"
    );
    let status = &schema["properties"]["status"]["properties"];
    for field in [
        "observedGeneration",
        "phase",
        "revision",
        "lastAppliedDigest",
        "message",
        "conditions",
        "layers",
        "lock",
        "history",
    ] {
        assert!(status.get(field).is_some(), "status.{field} is missing");
    }
    let layer = &status["layers"]["items"]["properties"];
    for field in [
        "chart",
        "name",
        "phase",
        "resources",
        "ready",
        "startedAt",
        "finishedAt",
        "message",
    ] {
        assert!(
            layer.get(field).is_some(),
            "status.layers[].{field} is missing"
        );
    }
    assert_eq!(
        status["layers"]["items"]["properties"]["phase"]["enum"],
        json!([
            "Pending",
            "Applying",
            "Waiting",
            "Ready",
            "Failed",
            "Deleting",
            "Deleted",
            "CleaningUp"
        ])
    );
    for field in ["holder", "sessionId", "lockedUntil"] {
        assert!(
            status["lock"]["properties"].get(field).is_some(),
            "status.lock.{field}"
        );
    }
    for field in [
        "revision",
        "chartVersion",
        "digest",
        "phase",
        "startedAt",
        "finishedAt",
        "sequenced",
    ] {
        assert!(
            status["history"]["items"]["properties"]
                .get(field)
                .is_some(),
            "status.history[].{field}"
        );
    }
    // An optional enum also lists null, which the API server accepts together with nullable.
    let phases: Vec<&Value> = status["phase"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| !v.is_null())
        .collect();
    assert_eq!(
        json!(phases),
        json!([
            "Pending",
            "Rendering",
            "Deploying",
            "Ready",
            "Failed",
            "RollingBack",
            "Uninstalling",
            "Testing",
            "Superseded"
        ])
    );
    assert_eq!(status["phase"]["nullable"], true);
}

/// The rules a real API server applies before it accepts a CRD schema as structural
/// (apiextensions-apiserver `structuralschema` validation), as far as a schema can break them.
fn structural_violations(node: &Value, path: &str, out: &mut Vec<String>) {
    let Some(map) = node.as_object() else {
        out.push(format!("{path}: not an object"));
        return;
    };
    for forbidden in ["$ref", "definitions", "$schema", "$defs", "id"] {
        if map.contains_key(forbidden) {
            out.push(format!("{path}: {forbidden} is not allowed"));
        }
    }
    let preserve = map.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
    let int_or_string = map.get("x-kubernetes-int-or-string") == Some(&json!(true));
    if !map.contains_key("type") && !preserve && !int_or_string {
        out.push(format!(
            "{path}.type: Required value: must not be empty for specified object fields"
        ));
    }
    if let Some(t) = map.get("type")
        && !t.is_string()
    {
        out.push(format!("{path}.type: must be a single string, got {t}"));
    }
    if map.contains_key("properties") && map.contains_key("additionalProperties") {
        out.push(format!(
            "{path}: properties and additionalProperties are mutually exclusive"
        ));
    }
    if map.get("type") == Some(&json!("array")) && !map.contains_key("items") {
        out.push(format!("{path}.items: Required value for arrays"));
    }
    for logic in ["anyOf", "oneOf", "allOf", "not"] {
        if let Some(branches) = map.get(logic) {
            let has_types = branches.to_string().contains("\"type\"");
            if has_types {
                out.push(format!(
                    "{path}.{logic}: must only carry value validations, not types"
                ));
            }
        }
    }
    // CEL compiles against the node's type; kube-apiserver gives none to an untyped node.
    if map.contains_key("x-kubernetes-validations") && !map.contains_key("type") && !int_or_string {
        out.push(format!(
            "{path}.x-kubernetes-validations: Internal error: rule compiler initialization error: \
             Failed to convert to declType for CEL validation rules"
        ));
    }
    if let Some(Value::Object(properties)) = map.get("properties") {
        for (name, child) in properties {
            structural_violations(child, &format!("{path}.properties[{name}]"), out);
        }
    }
    if let Some(items) = map.get("items") {
        structural_violations(items, &format!("{path}.items"), out);
    }
    if let Some(additional) = map.get("additionalProperties")
        && additional.is_object()
    {
        structural_violations(additional, &format!("{path}.additionalProperties"), out);
    }
}

#[test]
fn the_schema_is_structural() {
    let mut violations = Vec::new();
    structural_violations(&schema(), "openAPIV3Schema", &mut violations);
    assert!(
        violations.is_empty(),
        "not structural:\n{}",
        violations.join("\n")
    );
    // The checker itself finds what the recorded API server complained about.
    let mut found = Vec::new();
    structural_violations(
        &json!({"type": "object", "properties": {"spec": {"properties": {"values": {}}}}}),
        "x",
        &mut found,
    );
    assert_eq!(found.len(), 2, "{found:?}");
}

fn release(spec: Value) -> Value {
    json!({
        "apiVersion": "sequenced.dev/v1alpha1",
        "kind": "SequencedRelease",
        "metadata": {"name": "shop", "namespace": "default"},
        "spec": spec,
    })
}

/// What the API server's CEL rules say about an object; empty when it is accepted.
fn cel_errors(object: &Value) -> Vec<String> {
    match kube::core::cel::Validator::new().validate(&schema(), object, None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn cel_rules_compile_within_the_cost_budget() {
    let compiled = kube::core::cel::compile_schema(&schema());
    assert!(
        !compiled.has_errors(),
        "CEL rules do not compile: {:?}",
        compiled.compilation_errors()
    );
}

#[test]
fn a_good_spec_is_accepted() {
    for spec in [
        json!({"chart": {"path": "/charts/shop"}}),
        json!({"chart": {"repository": "https://charts.example.com", "name": "shop", "version": "^1.2"}}),
        json!({"chart": {"oci": "oci://ghcr.io/example/shop", "version": "1.2.3", "plainHttp": true}}),
        json!({"chart": {"configMapRef": {"name": "charts", "key": "shop.tgz"}}, "timeout": "1h30m", "readinessTimeout": "45s", "interval": "500ms"}),
        json!({"chart": {"secretRef": {"name": "charts", "key": "shop.tgz"}}, "releaseName": "shop-1", "values": {"a": {"b": [1, 2]}}}),
    ] {
        let errors = cel_errors(&release(spec.clone()));
        assert!(errors.is_empty(), "{spec} was rejected: {errors:?}");
    }
}

#[test]
fn a_bad_spec_is_rejected_with_a_message_a_user_understands() {
    let cases = [
        (json!({"chart": {}}), "chart needs exactly one source"),
        (
            json!({"chart": {"path": "/charts/a", "oci": "oci://r/a"}}),
            "chart needs exactly one source",
        ),
        (
            json!({"chart": {"repository": "https://charts.example.com"}}),
            "chart.name and chart.repository go together",
        ),
        (
            json!({"chart": {"path": "/charts/a", "version": "1.0.0"}}),
            "chart.version applies only to repository and oci charts",
        ),
        (
            json!({"chart": {"repository": "ftp://x", "name": "a"}}),
            "must be an http:// or https:// URL",
        ),
        (
            json!({"chart": {"oci": "ghcr.io/a"}}),
            "must be an OCI reference such as oci://",
        ),
        (
            json!({"chart": {"path": "/a", "plainHttp": true}}),
            "chart.plainHttp applies only to oci charts",
        ),
        (
            json!({"chart": {"path": "/a"}, "timeout": "5 minutes"}),
            "spec.timeout: must be a duration such as 30s, 5m or 1h30m",
        ),
        (
            json!({"chart": {"path": "/a"}, "readinessTimeout": "10"}),
            "spec.readinessTimeout: must be a duration",
        ),
        (
            json!({"chart": {"path": "/a"}, "interval": "1d"}),
            "spec.interval: must be a duration",
        ),
        (
            json!({"chart": {"path": "/a"}, "releaseName": "Shop_1"}),
            "must be a lowercase DNS label",
        ),
    ];
    for (spec, message) in cases {
        let errors = cel_errors(&release(spec.clone()));
        assert!(
            errors.iter().any(|e| e.contains(message)),
            "{spec}: expected an error containing {message:?}, got {errors:?}"
        );
    }
}

/// OpenAPI validation (types, enums, required fields, bounds), which the API server applies next
/// to the CEL rules. The schema is plain JSON Schema apart from the Kubernetes extensions.
fn openapi_errors(object: &Value) -> Vec<String> {
    let validator = jsonschema::validator_for(&schema()).expect("the schema compiles");
    validator
        .iter_errors(object)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

#[test]
fn enums_types_and_required_fields_are_enforced() {
    assert!(openapi_errors(&release(json!({"chart": {"path": "/a"}}))).is_empty());
    let cases = [
        (json!({}), "\"chart\" is a required property"),
        (
            json!({"chart": {"path": "/a"}, "sequencing": "sometimes"}),
            "/spec/sequencing",
        ),
        (
            json!({"chart": {"path": "/a"}, "onFailure": "retry"}),
            "/spec/onFailure",
        ),
        (
            json!({"chart": {"path": "/a"}, "retries": -1}),
            "/spec/retries",
        ),
        (
            json!({"chart": {"path": "/a"}, "values": [1]}),
            "/spec/values",
        ),
        (
            json!({"chart": {"path": "/a"}, "valuesFrom": [{"kind": "Pod", "name": "x"}]}),
            "/spec/valuesFrom/0/kind",
        ),
        (
            json!({"chart": {"configMapRef": {"name": "x"}}}),
            "\"key\" is a required property",
        ),
        (
            json!({"chart": {"path": "/a"}, "dependsOn": [{}]}),
            "\"name\" is a required property",
        ),
    ];
    for (spec, message) in cases {
        let errors = openapi_errors(&release(spec.clone()));
        assert!(
            errors.iter().any(|e| e.contains(message)),
            "{spec}: expected an error containing {message:?}, got {errors:?}"
        );
    }
}

#[test]
fn defaults_are_those_of_the_design() {
    let spec = &schema()["properties"]["spec"]["properties"];
    assert_eq!(spec["sequencing"]["default"], "ordered");
    assert_eq!(spec["timeout"]["default"], "5m");
    assert_eq!(spec["readinessTimeout"]["default"], "5m");
    assert_eq!(spec["wait"]["default"], true);
    assert_eq!(spec["onFailure"]["default"], "keep");
    assert_eq!(spec["maxHistory"]["default"], 10);
    assert_eq!(spec["interval"]["default"], "10m");
    assert_eq!(spec["values"]["x-kubernetes-preserve-unknown-fields"], true);
}

#[test]
fn the_rust_types_read_a_release_with_defaults_filled_in() {
    let release: sequenced::api::SequencedRelease = serde_json::from_value(release(json!({
        "chart": {"oci": "oci://ghcr.io/example/shop", "version": "1.2.3"},
        "values": {"replicas": 2, "nested": {"list": [1, "two", {"three": true}]}},
    })))
    .unwrap();
    assert_eq!(release.spec.timeout, "5m");
    assert!(release.spec.wait);
    assert_eq!(release.spec.sequencing, sequenced::api::Sequencing::Ordered);
    assert_eq!(release.spec.max_history, 10);
    assert_eq!(
        release.spec.values.unwrap()["nested"]["list"][2]["three"],
        true
    );
}

/// What the API server answers to a create of `release`: None when it is accepted, else the
/// 422 message.
async fn admitted(op: &sequenced_testkit::operator::Operator, release: Value) -> Option<String> {
    let api = op.releases("default");
    let sr: sequenced::api::SequencedRelease = serde_json::from_value(release).unwrap();
    match api.create(&Default::default(), &sr).await {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => {
            assert_eq!(
                (s.code, s.reason.as_str()),
                (422, "Invalid"),
                "{}",
                s.message
            );
            Some(s.message)
        }
        Err(other) => panic!("{other}"),
    }
}

#[tokio::test]
async fn the_api_server_refuses_a_release_name_longer_than_helm_allows() {
    let op = sequenced_testkit::operator::Operator::without_controller().await;
    let named = |name: &str, spec: Value| {
        let mut r = release(spec);
        r["metadata"]["name"] = json!(name);
        r
    };
    let long = "a".repeat(60);
    let chart = json!({"chart": {"path": "/charts/shop"}});
    assert_eq!(
        admitted(&op, named(&long, chart.clone())).await.as_deref(),
        Some(
            format!(
                "SequencedRelease.sequenced.dev \"{long}\" is invalid: <nil>: Invalid value: \"object\": \
                 the Helm release name defaults to metadata.name, {long}, which is longer than the 53 characters Helm allows: set a shorter spec.releaseName"
            )
            .as_str()
        )
    );
    let mut short = chart.clone();
    short["releaseName"] = json!("shop");
    assert_eq!(
        admitted(&op, named(&long, short)).await,
        None,
        "a short releaseName is enough"
    );
    let mut too_long = chart.clone();
    too_long["releaseName"] = json!("b".repeat(54));
    let refused = admitted(&op, named("shop2", too_long))
        .await
        .unwrap_or_default();
    assert!(
        refused.contains("is longer than the 53 characters Helm allows for a release name"),
        "{refused}"
    );
    assert_eq!(
        admitted(&op, named(&"c".repeat(53), chart.clone())).await,
        None,
        "53 is allowed"
    );
    // A rule on a field is reported at that field, with the type of its value.
    let mut slow = chart;
    slow["timeout"] = json!("soon");
    assert_eq!(
        admitted(&op, named("slow", slow)).await.as_deref(),
        Some(
            "SequencedRelease.sequenced.dev \"slow\" is invalid: spec.timeout: Invalid value: \"string\": \
             must be a duration such as 30s, 5m or 1h30m (units ms, s, m, h)"
        )
    );
}

#[test]
fn drift_detection_is_read_in_both_spellings_and_written_back_as_it_was() {
    use sequenced::api::{DriftDetection, DriftDetectionSpec};
    let read = |drift: Value| {
        let sr: sequenced::api::SequencedRelease = serde_json::from_value(release(
            json!({"chart": {"path": "/a"}, "driftDetection": drift}),
        ))
        .unwrap();
        let back = serde_json::to_value(&sr).unwrap()["spec"]["driftDetection"].clone();
        (sr.spec.drift_detection, back)
    };
    // The string of earlier releases.
    let (spec, back) = read(json!("warn"));
    assert_eq!(spec, DriftDetectionSpec::Mode(DriftDetection::Warn));
    assert_eq!(back, json!("warn"));
    assert!(spec.ignore().is_empty() && spec.problem().is_none());
    // Flux's object; `mode` defaults to enabled, today's default (Flux's is disabled).
    let rules = json!({"ignore": [{"paths": ["/spec/replicas"], "target": {"kind": "Deployment", "name": "app"}}]});
    let (spec, back) = read(rules.clone());
    assert_eq!(spec.mode(), DriftDetection::Enabled);
    assert_eq!(spec.ignore()[0].paths, ["/spec/replicas"]);
    assert_eq!(back, rules);
    let (spec, back) = read(json!({"mode": "disabled"}));
    assert_eq!(spec.mode(), DriftDetection::Disabled);
    assert_eq!(back, json!({"mode": "disabled"}));
    // Unset: enabled, as before.
    let sr: sequenced::api::SequencedRelease =
        serde_json::from_value(release(json!({"chart": {"path": "/a"}}))).unwrap();
    assert_eq!(sr.spec.drift_detection.mode(), DriftDetection::Enabled);
    // Neither shape: kept, and the release told what is wrong.
    for (drift, problem) in [
        (
            json!("sometimes"),
            "spec.driftDetection: \"sometimes\" is not one of enabled, warn, disabled",
        ),
        (
            json!({"ignores": []}),
            "spec.driftDetection: unknown field `ignores`, expected `mode` or `ignore`",
        ),
        (
            json!({"mode": "on"}),
            "spec.driftDetection: unknown variant `on`, expected one of `enabled`, `warn`, `disabled`",
        ),
        (
            json!(true),
            "spec.driftDetection: must be a mode (enabled, warn, disabled) or an object, not true",
        ),
    ] {
        let (spec, back) = read(drift.clone());
        assert_eq!(spec.problem().as_deref(), Some(problem), "{drift}");
        assert_eq!(back, drift);
    }
}

#[test]
fn drift_detection_is_an_untyped_node_without_cel_rules() {
    let drift = &schema()["properties"]["spec"]["properties"]["driftDetection"];
    assert_eq!(drift["x-kubernetes-preserve-unknown-fields"], true);
    assert!(drift.get("type").is_none(), "a string or an object");
    assert!(drift.get("x-kubernetes-validations").is_none());
    assert_eq!(drift["default"], "enabled", "unset reads as before");
    let mut found = Vec::new();
    structural_violations(
        &json!({"type": "object", "properties": {"d": {"x-kubernetes-preserve-unknown-fields": true, "x-kubernetes-validations": [{"rule": "true"}]}}}),
        "x",
        &mut found,
    );
    assert_eq!(found.len(), 1, "{found:?}");
}

#[tokio::test]
async fn the_api_server_keeps_either_spelling_and_refuses_cel_on_an_untyped_node() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let op = sequenced_testkit::operator::Operator::without_controller().await;
    let named = |name: &str, drift: Option<Value>| {
        let mut r = release(json!({"chart": {"path": "/charts/shop"}}));
        r["metadata"]["name"] = json!(name);
        if let Some(drift) = drift {
            r["spec"]["driftDetection"] = drift;
        }
        r
    };
    let rules = json!({"mode": "warn", "ignore": [{"paths": ["/webhooks/0/clientConfig/caBundle"], "target": {"kind": "ValidatingWebhookConfiguration"}}]});
    for (name, drift, stored) in [
        ("string", Some(json!("warn")), json!("warn")),
        ("object", Some(rules.clone()), rules.clone()),
        ("unset", None, json!("enabled")),
    ] {
        assert_eq!(admitted(&op, named(name, drift)).await, None, "{name}");
        let object = op
            .server
            .object(
                "sequenced.dev/v1alpha1",
                "SequencedRelease",
                Some("default"),
                name,
            )
            .unwrap();
        assert_eq!(object["spec"]["driftDetection"], stored, "{name}");
    }
    // A CEL rule on such a node: kube-apiserver cannot compile it, and neither does this one.
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(COPIES[0])).unwrap();
    let mut crd: Value = serde_yaml_ng::from_str(&text).unwrap();
    crd["metadata"]["name"] = json!("tries.example.com");
    crd["spec"]["group"] = json!("example.com");
    crd["spec"]["names"] = json!({"plural": "tries", "singular": "try", "kind": "Try"});
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["driftDetection"]
        ["x-kubernetes-validations"] =
        json!([{"rule": "type(self) == string ? self in ['enabled', 'warn', 'disabled'] : true"}]);
    let crd: CustomResourceDefinition = serde_json::from_value(crd).unwrap();
    let api: kube::Api<CustomResourceDefinition> = kube::Api::all(op.client.clone());
    match api.create(&Default::default(), &crd).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{}", s.message);
            assert!(
                s.message.contains("properties[spec].properties[driftDetection].x-kubernetes-validations: Internal error: rule compiler initialization error: Failed to convert to declType for CEL validation rules"),
                "{}",
                s.message
            );
        }
        other => panic!("a CEL rule on an untyped node was accepted: {other:?}"),
    }
}

/// kube-apiserver 1.36 refused this very CRD (with `valuesFrom` unbounded) at apply: "estimated
/// rule cost exceeds budget by factor of more than 100x" for the `targetPath` pattern, a rule on
/// strings inside an array of no `maxItems`. The test API server refuses it the same way, and
/// the committed CRD bounds the array.
#[tokio::test]
async fn a_rule_on_strings_in_an_unbounded_array_is_over_the_cost_budget() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let op = sequenced_testkit::operator::Operator::without_controller().await;
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(COPIES[0])).unwrap();
    let committed: Value = serde_yaml_ng::from_str(&text).unwrap();
    let values_from =
        "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/valuesFrom";
    assert_eq!(
        committed.pointer(&format!("{values_from}/maxItems")),
        Some(&json!(100))
    );
    let api: kube::Api<CustomResourceDefinition> = kube::Api::all(op.client.clone());
    let mut crd = committed.clone();
    crd["metadata"]["name"] = json!("tries.example.com");
    crd["spec"]["group"] = json!("example.com");
    crd["spec"]["names"] = json!({"plural": "tries", "singular": "try", "kind": "Try"});
    crd.pointer_mut(values_from)
        .and_then(Value::as_object_mut)
        .unwrap()
        .remove("maxItems");
    let unbounded: CustomResourceDefinition = serde_json::from_value(crd).unwrap();
    match api.create(&Default::default(), &unbounded).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{}", s.message);
            assert!(
                s.message.contains("properties[valuesFrom].items.properties[targetPath].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget"),
                "{}",
                s.message
            );
        }
        other => panic!("a costly rule in an unbounded array was accepted: {other:?}"),
    }
    // Bounded, as committed: accepted.
    let mut crd = committed;
    crd["metadata"]["name"] = json!("bounds.example.com");
    crd["spec"]["group"] = json!("example.com");
    crd["spec"]["names"] = json!({"plural": "bounds", "singular": "bound", "kind": "Bound"});
    let bounded: CustomResourceDefinition = serde_json::from_value(crd).unwrap();
    api.create(&Default::default(), &bounded).await.unwrap();
}
