//! ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) as kube-apiserver's admission
//! plugin of that name applies it: every create, update and delete (a delete of a collection
//! once per object) is judged, after the object's own validation and before it is stored, by
//! each stored policy whose `matchConstraints` select it and by each of the policy's bindings
//! whose `matchResources` do: the policy's `matchConditions`, then its `variables` and
//! `validations`, in CEL, with `object`, `oldObject`, `request` (its `userInfo` names the user
//! the request runs as, after impersonation), `namespaceObject` and `variables` bound. A
//! validation that is false is refused with kube-apiserver's Status (its
//! `validating/dispatcher.go`):
//!
//! ```text
//! <resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with binding
//! '<binding>' denied request: <message>
//! ```
//!
//! with the validation's `reason` (Invalid, 422, unless told: Forbidden 403, Unauthorized 401,
//! RequestEntityTooLarge 413) and the same text as the one cause; the message is the
//! `messageExpression`'s string, else `message`, else `failed expression: <expression>`. An
//! expression that fails to evaluate denies the request under `failurePolicy: Fail` (the
//! default), with `expression '<expression>' resulted in error: <error>`, and is ignored under
//! `Ignore`. Bindings act only with `validationActions` `Deny`. Policies and bindings are
//! themselves checked when written (required fields, supported values, every expression
//! compiled and its identifiers declared), and never judged by a policy (as kube-apiserver
//! exempts them and the webhook configurations).

use std::collections::HashMap;
use std::sync::Arc;

use http::Method;
use kube::core::cel::cel;
use serde_json::{Value, json};

use super::errors::{ApiError, FieldError, FieldErrorKind};
use super::rbac::User;
use super::select::LabelSelector;
use super::store::{self, State};
use super::{Reply, Req, Route, Target};

const GROUP: &str = "admissionregistration.k8s.io";
const POLICIES: &str = "validatingadmissionpolicies";
const BINDINGS: &str = "validatingadmissionpolicybindings";
/// The longest message a messageExpression may give (celconfig.MaxEvaluatedMessageExpressionSizeBytes).
const MAX_MESSAGE: usize = 5 * 1024;

/// The admission operations.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}

/// One write as the admission plugin sees it.
struct Attributes<'a> {
    t: &'a Target,
    operation: Operation,
    /// As a Status names it: the object's name (its generateName on a create without one).
    name: String,
    object: Option<Value>,
    old: Option<Value>,
    user: &'a User,
    dry_run: bool,
}

/// Judges a write by the stored ValidatingAdmissionPolicies, and checks a policy or binding
/// being written: Ok when the request may go on to be stored, the refusal otherwise.
pub(super) fn admit(
    state: &mut State,
    req: &Req,
    route: &Route,
    body: &Option<Result<Value, String>>,
    user: &User,
) -> Result<(), ApiError> {
    let Route::Resource(t) = route else {
        return Ok(());
    };
    let t: &Target = t;
    if !matches!(
        req.method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) || t.rt.is_review()
        || t.sub == "log"
    {
        return Ok(());
    }
    let exempt = t.rt.group == GROUP
        && matches!(
            t.rt.kind.as_str(),
            "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
                | "ValidatingWebhookConfiguration"
                | "MutatingWebhookConfiguration"
        );
    let policies = stored(state, POLICIES);
    if exempt {
        if !matches!(
            t.rt.kind.as_str(),
            "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding"
        ) || req.method == Method::DELETE
        {
            return Ok(());
        }
        return match dry_run(state, req, t, body, user) {
            Some(object) if t.sub.is_empty() => check_configuration(&t.rt.kind, &object),
            _ => Ok(()),
        };
    }
    if policies.is_empty() {
        return Ok(());
    }
    let bindings = stored(state, BINDINGS);
    let dry_run_asked = req.dry_run();
    let existing = if t.name.is_empty() {
        None
    } else {
        state
            .get(&t.rt, &t.namespace, &t.name)
            .ok()
            .map(|o| store::present(&t.rt, &t.version, &o))
    };
    let apply = req.content_type().as_deref() == Some("application/apply-patch+yaml");
    let mut writes: Vec<Attributes> = Vec::new();
    match (&req.method, t.name.is_empty()) {
        (&Method::DELETE, true) => {
            let Ok(selection) = super::selection(req, &t.rt) else {
                return Ok(());
            };
            let namespace = (!t.namespace.is_empty()).then_some(t.namespace.as_str());
            let selected: Vec<Value> = state
                .of_resource(&t.rt.storage_group, &t.rt.storage_resource, namespace)
                .map(|(_, o)| store::present(&t.rt, &t.version, o))
                .filter(|o| selection.labels.matches_object(o) && selection.fields.matches(o))
                .collect();
            for old in selected {
                writes.push(Attributes {
                    t,
                    operation: Operation::Delete,
                    name: name_of(&old),
                    object: None,
                    old: Some(old),
                    user,
                    dry_run: dry_run_asked,
                });
            }
        }
        (&Method::DELETE, false) => {
            let Some(old) = existing else {
                return Ok(());
            };
            writes.push(Attributes {
                t,
                operation: Operation::Delete,
                name: t.name.clone(),
                object: None,
                old: Some(old),
                user,
                dry_run: dry_run_asked,
            });
        }
        (method, _) => {
            let operation = match (method, &existing) {
                (&Method::POST, _) => Operation::Create,
                (_, Some(_)) => Operation::Update,
                (&Method::PUT, None) if t.rt.create_on_update() => Operation::Create,
                (&Method::PATCH, None) if apply => Operation::Create,
                // Not found: answered so by the handler.
                _ => return Ok(()),
            };
            let probe = Attributes {
                t,
                operation,
                name: t.name.clone(),
                object: None,
                old: None,
                user,
                dry_run: dry_run_asked,
            };
            if !policies
                .iter()
                .any(|p| rules_match(&p["spec"]["matchConstraints"], &probe, true))
            {
                return Ok(());
            }
            // The object as it would be stored: what the handler makes of the request, without
            // storing it. A request it refuses is refused before admission, as by the server.
            let Some(object) = dry_run(state, req, t, body, user) else {
                return Ok(());
            };
            let name = if t.name.is_empty() {
                let named = name_of(&object);
                match object["metadata"]["generateName"].as_str() {
                    Some(prefix) if named.is_empty() => prefix.to_string(),
                    _ => named,
                }
            } else {
                t.name.clone()
            };
            writes.push(Attributes {
                object: Some(object),
                old: existing.filter(|_| operation == Operation::Update),
                name,
                ..probe
            });
        }
    }
    for write in &writes {
        judge(state, &policies, &bindings, write)?;
    }
    Ok(())
}

fn name_of(object: &Value) -> String {
    object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The stored objects of one of this group's resources, in name order.
fn stored(state: &State, resource: &str) -> Vec<Value> {
    state
        .of_resource(GROUP, resource, None)
        .map(|(_, o)| o.clone())
        .collect()
}

/// What the handler would store for this request (a dry run of it); None when it refuses it.
fn dry_run(
    state: &mut State,
    req: &Req,
    t: &Target,
    body: &Option<Result<Value, String>>,
    user: &User,
) -> Option<Value> {
    let mut dry = req.clone();
    dry.params.push(("dryRun".into(), "All".into()));
    dry.headers.remove(http::header::ACCEPT);
    match super::resource(state, &dry, t, body.clone(), user) {
        Ok(Reply::Json { status, body, .. }) if status < 300 => Some(body),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Matching

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Whether one of `rules` (NamedRuleWithOperations) selects the write.
fn rule_matches(rule: &Value, write: &Attributes) -> bool {
    let has = |field: &str, wanted: &str| {
        strings(&rule[field])
            .iter()
            .any(|v| *v == "*" || *v == wanted)
    };
    let rt = &write.t.rt;
    let resource_ok = strings(&rule["resources"]).iter().any(|r| {
        let (resource, sub) = r.split_once('/').unwrap_or((r, ""));
        (resource == "*" || resource == rt.plural) && (sub == "*" || sub == write.t.sub)
    });
    let scope_ok = match rule["scope"].as_str().unwrap_or("*") {
        "Cluster" => !rt.namespaced,
        "Namespaced" => rt.namespaced,
        _ => true,
    };
    let names = strings(&rule["resourceNames"]);
    has("apiGroups", &rt.group)
        && has("apiVersions", &write.t.version)
        && has("operations", write.operation.as_str())
        && resource_ok
        && scope_ok
        && (names.is_empty() || names.contains(&write.name.as_str()))
}

/// Whether `matchResources` selects the write by its resource rules (`required`: a policy's
/// constraints select nothing without rules; a binding's select what its policy does).
fn rules_match(resources: &Value, write: &Attributes, required: bool) -> bool {
    let rules = resources["resourceRules"].as_array();
    let included = match rules {
        Some(rules) if !rules.is_empty() => rules.iter().any(|r| rule_matches(r, write)),
        _ => !required,
    };
    let excluded = resources["excludeResourceRules"]
        .as_array()
        .is_some_and(|rules| rules.iter().any(|r| rule_matches(r, write)));
    included && !excluded
}

/// A selector of a policy or binding: unset selects everything; None for one that cannot be
/// read (refused when the policy was written), which selects nothing.
fn selector(value: &Value) -> Option<LabelSelector> {
    if value.is_null() {
        return LabelSelector::from_json(&json!({})).ok();
    }
    LabelSelector::from_json(value).ok()
}

/// Whether `matchResources` (a policy's matchConstraints or a binding's matchResources) selects
/// the write: its rules, namespaceSelector and objectSelector.
fn resources_match(state: &State, resources: &Value, write: &Attributes, required: bool) -> bool {
    if !rules_match(resources, write, required) {
        return false;
    }
    let (Some(namespaces), Some(objects)) = (
        selector(&resources["namespaceSelector"]),
        selector(&resources["objectSelector"]),
    ) else {
        return false;
    };
    let namespace_ok = if namespaces.is_empty() {
        true
    } else if write.t.rt.group.is_empty() && write.t.rt.kind == "Namespace" {
        // A namespace is judged by its own labels.
        write
            .object
            .iter()
            .chain(write.old.iter())
            .any(|o| namespaces.matches_object(o))
    } else if !write.t.rt.namespaced {
        // Other cluster-scoped objects are never skipped by a namespaceSelector.
        true
    } else {
        namespace_object(state, &write.t.namespace).is_some_and(|ns| namespaces.matches_object(&ns))
    };
    let object_ok = objects.is_empty()
        || write
            .object
            .iter()
            .chain(write.old.iter())
            .any(|o| objects.matches_object(o));
    namespace_ok && object_ok
}

fn namespace_object(state: &State, namespace: &str) -> Option<Value> {
    let rt = state.find_type("", "v1", "namespaces")?;
    state
        .get(&rt, "", namespace)
        .ok()
        .map(|o| store::present(&rt, "v1", &o))
}

// ---------------------------------------------------------------------------------------------
// Judging

/// What one binding of a policy decided.
struct Denial {
    policy: String,
    binding: Option<String>,
    message: String,
    reason: String,
}

fn judge(
    state: &State,
    policies: &[Value],
    bindings: &[Value],
    write: &Attributes,
) -> Result<(), ApiError> {
    let mut denials: Vec<Denial> = Vec::new();
    for policy in policies {
        let name = name_of(policy);
        let spec = &policy["spec"];
        if !resources_match(state, &spec["matchConstraints"], write, true) {
            continue;
        }
        let fail = spec["failurePolicy"].as_str() != Some("Ignore");
        for binding in bindings
            .iter()
            .filter(|b| b["spec"]["policyName"].as_str() == Some(name.as_str()))
        {
            let binding_spec = &binding["spec"];
            if !binding_spec["matchResources"].is_null()
                && !resources_match(state, &binding_spec["matchResources"], write, false)
            {
                continue;
            }
            let binding_name = name_of(binding);
            let deny = strings(&binding_spec["validationActions"]).contains(&"Deny");
            let decisions = if !binding_spec["paramRef"].is_null() || !spec["paramKind"].is_null() {
                vec![Decision::Error(
                    "failed to configure binding: params (paramKind, paramRef) are not supported by this test API server"
                        .to_string(),
                )]
            } else {
                evaluate(state, spec, write)
            };
            for decision in decisions {
                let (message, reason) = match decision {
                    Decision::Deny { message, reason } => (message, reason),
                    Decision::Error(message) if fail => (message, "Invalid".to_string()),
                    Decision::Error(_) => continue,
                };
                if deny {
                    denials.push(Denial {
                        policy: name.clone(),
                        binding: Some(binding_name.clone()),
                        message,
                        reason,
                    });
                }
            }
        }
    }
    let Some(denial) = denials.into_iter().next() else {
        return Ok(());
    };
    let message = match &denial.binding {
        Some(binding) => format!(
            "ValidatingAdmissionPolicy '{}' with binding '{binding}' denied request: {}",
            denial.policy, denial.message
        ),
        None => format!(
            "ValidatingAdmissionPolicy '{}' denied request: {}",
            denial.policy, denial.message
        ),
    };
    let name = if write.name.is_empty() {
        "Unknown"
    } else {
        write.name.as_str()
    };
    let mut error = ApiError::forbidden(&write.t.rt.group, &write.t.rt.plural, name, &message);
    let code = match denial.reason.as_str() {
        "Forbidden" => 403,
        "Unauthorized" => 401,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    };
    error.code = code;
    error.body["code"] = json!(code);
    error.body["reason"] = json!(denial.reason);
    error.body["details"]["causes"] = json!([{"message": message}]);
    Err(error)
}

/// What a policy's expressions decided about a write, per validation that did not admit it.
enum Decision {
    Deny {
        message: String,
        reason: String,
    },
    /// An expression that could not be evaluated: denied or ignored by the failurePolicy.
    Error(String),
}

/// A JSON value as CEL sees it: integers as int, objects as maps with string keys.
fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(map) => {
            let entries: HashMap<cel::objects::Key, cel::Value> = map
                .iter()
                .map(|(k, v)| (cel::objects::Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            cel::Value::Map(cel::objects::Map {
                map: Arc::new(entries),
            })
        }
    }
}

/// The `request` variable: the admission request, as `k8s.io/api/admission/v1` AdmissionRequest
/// shows it to CEL (without the objects, which are variables of their own).
fn request(write: &Attributes) -> Value {
    let t = write.t;
    let kind = json!({"group": t.rt.group, "version": t.version, "kind": t.rt.kind});
    let resource = json!({"group": t.rt.group, "version": t.version, "resource": t.rt.plural});
    let options = match write.operation {
        Operation::Create => json!({"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}),
        Operation::Update => json!({"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"}),
        Operation::Delete => json!({"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions"}),
    };
    json!({
        "uid": "",
        "kind": kind,
        "resource": resource,
        "subResource": t.sub,
        "requestKind": kind,
        "requestResource": resource,
        "requestSubResource": t.sub,
        "name": write.name,
        "namespace": t.namespace,
        "operation": write.operation.as_str(),
        "userInfo": {"username": write.user.name, "uid": "", "groups": write.user.groups},
        "dryRun": write.dry_run,
        "options": options,
    })
}

/// Runs one expression; its value, or `expression '<expression>' resulted in error: <error>`.
fn run(context: &cel::Context, expression: &str) -> Result<cel::Value, String> {
    let program = cel::Program::compile(expression)
        .map_err(|e| format!("expression '{expression}' resulted in error: {e}"))?;
    program
        .execute(context)
        .map_err(|e| format!("expression '{expression}' resulted in error: {e}"))
}

fn evaluate(state: &State, spec: &Value, write: &Attributes) -> Vec<Decision> {
    use kube::core::cel::KubeCelExt;
    let mut context = cel::Context::default();
    context.register_all();
    context.add_variable_from_value(
        "object",
        to_cel(write.object.as_ref().unwrap_or(&Value::Null)),
    );
    context.add_variable_from_value(
        "oldObject",
        to_cel(write.old.as_ref().unwrap_or(&Value::Null)),
    );
    context.add_variable_from_value("request", to_cel(&request(write)));
    if write.t.rt.namespaced
        && let Some(ns) = namespace_object(state, &write.t.namespace)
    {
        // What kube-apiserver exposes of the namespace.
        let exposed = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": ns["metadata"],
                             "spec": ns["spec"], "status": ns["status"]});
        context.add_variable_from_value("namespaceObject", to_cel(&exposed));
    }
    // Variables, each in order and able to read the ones before it. One that fails is left
    // out: an expression that reads it fails too.
    let mut variables: HashMap<cel::objects::Key, cel::Value> = HashMap::new();
    for variable in spec["variables"].as_array().into_iter().flatten() {
        context.add_variable_from_value(
            "variables",
            cel::Value::Map(cel::objects::Map {
                map: Arc::new(variables.clone()),
            }),
        );
        let name = variable["name"].as_str().unwrap_or_default();
        if let Ok(value) = run(
            &context,
            variable["expression"].as_str().unwrap_or_default(),
        ) {
            variables.insert(cel::objects::Key::String(Arc::new(name.to_string())), value);
        }
    }
    context.add_variable_from_value(
        "variables",
        cel::Value::Map(cel::objects::Map {
            map: Arc::new(variables),
        }),
    );
    // matchConditions: all true, or the policy does not apply; an error fails it under Fail.
    let mut errors = Vec::new();
    for condition in spec["matchConditions"].as_array().into_iter().flatten() {
        match run(
            &context,
            condition["expression"].as_str().unwrap_or_default(),
        ) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => return Vec::new(),
            Ok(other) => errors.push(format!(
                "expression '{}' resulted in error: a {:?}, not a bool",
                condition["expression"].as_str().unwrap_or_default(),
                other.type_of()
            )),
            Err(e) => errors.push(e),
        }
    }
    match errors.len() {
        0 => {}
        1 => return vec![Decision::Error(errors.remove(0))],
        _ => return vec![Decision::Error(format!("[{}]", errors.join(", ")))],
    }
    let mut decisions = Vec::new();
    for validation in spec["validations"].as_array().into_iter().flatten() {
        let expression = validation["expression"].as_str().unwrap_or_default();
        match run(&context, expression) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => {
                let evaluated = validation["messageExpression"]
                    .as_str()
                    .filter(|m| !m.trim().is_empty())
                    .and_then(|m| match run(&context, m) {
                        Ok(cel::Value::String(s)) => Some(s.trim().to_string()),
                        _ => None,
                    })
                    .filter(|m| m.len() <= MAX_MESSAGE && !m.contains('\n'))
                    .filter(|m| !m.is_empty());
                let message = evaluated
                    .or_else(|| {
                        validation["message"]
                            .as_str()
                            .map(|m| m.trim().to_string())
                            .filter(|m| !m.is_empty())
                    })
                    .unwrap_or_else(|| format!("failed expression: {}", expression.trim()));
                decisions.push(Decision::Deny {
                    message,
                    reason: validation["reason"]
                        .as_str()
                        .unwrap_or("Invalid")
                        .to_string(),
                });
            }
            Ok(other) => decisions.push(Decision::Error(format!(
                "expression '{expression}' resulted in error: a {:?}, not a bool",
                other.type_of()
            ))),
            Err(e) => decisions.push(Decision::Error(e)),
        }
    }
    decisions
}

// ---------------------------------------------------------------------------------------------
// Policies and bindings as written

/// The identifiers every expression may read (with `params` when the policy has a paramKind).
const DECLARED: &[&str] = &[
    "object",
    "oldObject",
    "request",
    "namespaceObject",
    "authorizer",
    "variables",
    // CEL's type names.
    "int",
    "uint",
    "double",
    "bool",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "dyn",
];

/// The identifiers `expression` reads that are not bound: comprehension variables are.
fn undeclared(expr: &cel::IdedExpr, bound: &mut Vec<String>, found: &mut Vec<String>) {
    use cel::common::ast::{EntryExpr, Expr};
    match &expr.expr {
        Expr::Ident(name) => {
            if !name.starts_with('@') && !bound.iter().any(|b| b == name) && !found.contains(name) {
                found.push(name.clone());
            }
        }
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                undeclared(target, bound, found);
            }
            for arg in &call.args {
                undeclared(arg, bound, found);
            }
        }
        Expr::Select(select) => undeclared(&select.operand, bound, found),
        Expr::List(list) => {
            for e in &list.elements {
                undeclared(e, bound, found);
            }
        }
        Expr::Map(map) => {
            for entry in &map.entries {
                if let EntryExpr::MapEntry(e) = &entry.expr {
                    undeclared(&e.key, bound, found);
                    undeclared(&e.value, bound, found);
                }
            }
        }
        Expr::Struct(s) => {
            for entry in &s.entries {
                match &entry.expr {
                    EntryExpr::StructField(f) => undeclared(&f.value, bound, found),
                    EntryExpr::MapEntry(e) => {
                        undeclared(&e.key, bound, found);
                        undeclared(&e.value, bound, found);
                    }
                }
            }
        }
        Expr::Comprehension(c) => {
            undeclared(&c.iter_range, bound, found);
            undeclared(&c.accu_init, bound, found);
            let before = bound.len();
            bound.push(c.iter_var.clone());
            bound.extend(c.iter_var2.clone());
            bound.push(c.accu_var.clone());
            undeclared(&c.loop_cond, bound, found);
            undeclared(&c.loop_step, bound, found);
            undeclared(&c.result, bound, found);
            bound.truncate(before);
        }
        Expr::Literal(_) | Expr::Unspecified => {}
    }
}

/// Why `expression` does not compile, in kube-apiserver's words: parse errors, and identifiers
/// that are not declared (what its type check says first).
fn compile_error(expression: &str, params: bool) -> Option<String> {
    let parsed = match cel::parser::Parser::new().parse(expression) {
        Ok(parsed) => parsed,
        Err(e) => return Some(format!("compilation failed: ERROR: <input>: {e}")),
    };
    let mut bound: Vec<String> = DECLARED.iter().map(|s| s.to_string()).collect();
    if params {
        bound.push("params".into());
    }
    let mut found = Vec::new();
    undeclared(&parsed, &mut bound, &mut found);
    found.first().map(|name| {
        format!("compilation failed: ERROR: <input>:1:1: undeclared reference to '{name}' (in container '')")
    })
}

fn duplicate(field: String, value: &str) -> FieldError {
    FieldError {
        kind: FieldErrorKind::Duplicate(super::errors::quote(value)),
        field,
        detail: String::new(),
    }
}

fn check_expression(field: String, value: &Value, params: bool, errors: &mut Vec<FieldError>) {
    match value.as_str().map(str::trim) {
        None | Some("") => errors.push(FieldError::required(field, "expression is not specified")),
        Some(expression) => {
            if let Some(why) = compile_error(expression, params) {
                errors.push(FieldError::invalid(
                    field,
                    value.as_str().unwrap_or_default(),
                    why,
                ));
            }
        }
    }
}

fn check_rules(rules: &Value, field: &str, errors: &mut Vec<FieldError>) {
    for (i, rule) in rules.as_array().into_iter().flatten().enumerate() {
        let at = format!("{field}[{i}]");
        for list in ["apiGroups", "apiVersions", "resources", "operations"] {
            if strings(&rule[list]).is_empty() {
                errors.push(FieldError::required(format!("{at}.{list}"), ""));
            }
        }
        for (j, op) in strings(&rule["operations"]).into_iter().enumerate() {
            if !matches!(op, "*" | "CREATE" | "UPDATE" | "DELETE" | "CONNECT") {
                errors.push(FieldError::not_supported(
                    format!("{at}.operations[{j}]"),
                    op,
                    &["*", "CONNECT", "CREATE", "DELETE", "UPDATE"],
                ));
            }
        }
        if let Some(scope) = rule["scope"].as_str()
            && !matches!(scope, "*" | "Cluster" | "Namespaced")
        {
            errors.push(FieldError::not_supported(
                format!("{at}.scope"),
                scope,
                &["*", "Cluster", "Namespaced"],
            ));
        }
    }
}

fn check_match_resources(resources: &Value, field: &str, errors: &mut Vec<FieldError>) {
    check_rules(
        &resources["resourceRules"],
        &format!("{field}.resourceRules"),
        errors,
    );
    check_rules(
        &resources["excludeResourceRules"],
        &format!("{field}.excludeResourceRules"),
        errors,
    );
    if let Some(policy) = resources["matchPolicy"].as_str()
        && !matches!(policy, "Exact" | "Equivalent")
    {
        errors.push(FieldError::not_supported(
            format!("{field}.matchPolicy"),
            policy,
            &["Equivalent", "Exact"],
        ));
    }
    for selector in ["namespaceSelector", "objectSelector"] {
        let value = &resources[selector];
        if !value.is_null()
            && let Err(why) = LabelSelector::from_json(value)
        {
            errors.push(FieldError::invalid(format!("{field}.{selector}"), "", why));
        }
    }
}

/// kube-apiserver's validation of a ValidatingAdmissionPolicy or its binding (the parts that
/// decide whether it can act at all).
fn check_configuration(kind: &str, object: &Value) -> Result<(), ApiError> {
    let spec = &object["spec"];
    let mut errors = Vec::new();
    if kind == "ValidatingAdmissionPolicy" {
        let params = !spec["paramKind"].is_null();
        if let Some(policy) = spec["failurePolicy"].as_str()
            && !matches!(policy, "Fail" | "Ignore")
        {
            errors.push(FieldError::not_supported(
                "spec.failurePolicy",
                policy,
                &["Fail", "Ignore"],
            ));
        }
        let constraints = &spec["matchConstraints"];
        if constraints.is_null() {
            errors.push(FieldError::required("spec.matchConstraints", ""));
        } else {
            check_match_resources(constraints, "spec.matchConstraints", &mut errors);
            if strings(&constraints["resourceRules"]).is_empty()
                && constraints["resourceRules"]
                    .as_array()
                    .is_none_or(Vec::is_empty)
            {
                errors.push(FieldError::required(
                    "spec.matchConstraints.resourceRules",
                    "",
                ));
            }
        }
        let mut names: Vec<&str> = Vec::new();
        for (i, condition) in spec["matchConditions"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let at = format!("spec.matchConditions[{i}]");
            check_expression(
                format!("{at}.expression"),
                &condition["expression"],
                params,
                &mut errors,
            );
            match condition["name"].as_str() {
                None | Some("") => errors.push(FieldError::required(format!("{at}.name"), "")),
                Some(name) if names.contains(&name) => {
                    errors.push(duplicate(format!("{at}.name"), name));
                }
                Some(name) => names.push(name),
            }
        }
        for (i, variable) in spec["variables"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let at = format!("spec.variables[{i}]");
            match variable["name"].as_str().map(str::trim) {
                None | Some("") => errors.push(FieldError::required(
                    format!("{at}.name"),
                    "name is not specified",
                )),
                Some(name) => {
                    let identifier = name
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                    if !identifier {
                        errors.push(FieldError::invalid(
                            format!("{at}.name"),
                            name,
                            "name is not a valid CEL identifier",
                        ));
                    }
                }
            }
            check_expression(
                format!("{at}.expression"),
                &variable["expression"],
                params,
                &mut errors,
            );
        }
        let validations = spec["validations"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let audits = spec["auditAnnotations"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        if validations.is_empty() && audits.is_empty() {
            for field in ["spec.validations", "spec.auditAnnotations"] {
                errors.push(FieldError::required(
                    field,
                    "validations or auditAnnotations must contain at least one item",
                ));
            }
        }
        for (i, validation) in validations.iter().enumerate() {
            let at = format!("spec.validations[{i}]");
            check_expression(
                format!("{at}.expression"),
                &validation["expression"],
                params,
                &mut errors,
            );
            if let Some(message) = validation["messageExpression"].as_str() {
                if message.trim().is_empty() {
                    errors.push(FieldError::invalid(
                        format!("{at}.messageExpression"),
                        message,
                        "must be non-empty if specified",
                    ));
                } else if let Some(why) = compile_error(message, params) {
                    errors.push(FieldError::invalid(
                        format!("{at}.messageExpression"),
                        message,
                        why,
                    ));
                }
            }
            if let Some(message) = validation["message"].as_str() {
                if !message.is_empty() && message.trim().is_empty() {
                    errors.push(FieldError::invalid(
                        format!("{at}.message"),
                        message,
                        "message must be non-empty if specified",
                    ));
                } else if message.trim().contains('\n') {
                    errors.push(FieldError::invalid(
                        format!("{at}.message"),
                        message,
                        "message must not contain line breaks",
                    ));
                }
            }
            if let Some(reason) = validation["reason"].as_str()
                && !matches!(
                    reason,
                    "Unauthorized" | "Forbidden" | "Invalid" | "RequestEntityTooLarge"
                )
            {
                errors.push(FieldError::not_supported(
                    format!("{at}.reason"),
                    reason,
                    &[
                        "Forbidden",
                        "Invalid",
                        "RequestEntityTooLarge",
                        "Unauthorized",
                    ],
                ));
            }
        }
    } else {
        if spec["policyName"].as_str().is_none_or(str::is_empty) {
            errors.push(FieldError::required("spec.policyName", ""));
        }
        let actions = strings(&spec["validationActions"]);
        let mut seen: Vec<&str> = Vec::new();
        for (i, action) in actions.iter().enumerate() {
            let at = format!("spec.validationActions[{i}]");
            if !matches!(*action, "Deny" | "Warn" | "Audit") {
                errors.push(FieldError::not_supported(
                    at.clone(),
                    action,
                    &["Audit", "Deny", "Warn"],
                ));
            }
            if seen.contains(action) {
                errors.push(duplicate(at, action));
            }
            seen.push(action);
        }
        if seen.contains(&"Deny") && seen.contains(&"Warn") {
            errors.push(FieldError::invalid(
                "spec.validationActions",
                &format!("[{}]", actions.join(" ")),
                "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)",
            ));
        }
        if seen.is_empty() {
            errors.push(FieldError::required(
                "spec.validationActions",
                "at least one validation action is required",
            ));
        }
        if !spec["matchResources"].is_null() {
            check_match_resources(&spec["matchResources"], "spec.matchResources", &mut errors);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(GROUP, kind, &name_of(object), &errors))
    }
}
