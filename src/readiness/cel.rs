//! Readiness written in CEL, the Common Expression Language Kubernetes uses for validation rules
//! and Flux for health checks (interpreted by the `cel` crate, the one kube's `cel` feature uses).
//!
//! * [`Cel`]: one expression, parsed once ([`Cel::compile`]) and evaluated to a boolean over an
//!   object as often as needed ([`Cel::holds`]). The object is `self`, and each of its top-level
//!   fields is a variable too (`status`, `metadata`, `spec`, ...), as Flux's `healthCheckExprs`
//!   see them. A field the object does not have yet is an evaluation error, which readiness
//!   reads as "not ready yet, because": `has(self.status.x)` tests for one. The optional
//!   field syntax (`a.?b`) is refused: this interpreter does not follow CEL's meaning of it.
//! * [`HealthCheck`]: Flux's `healthCheckExprs` entry for one kind: `inProgress`, `failed` and
//!   `current` expressions judged in that order (Flux's RFC 0009), after the generation check.
//! * [`HealthChecks`]: the entries of a spec, found by an object's API group and kind.
//!
//! Pure: nothing here reads a clock (the `cel` crate's context has no `now`) or does I/O.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use cel::objects::{Key, Map};
use serde_json::Value;

use super::Verdict;
use super::expr::quote;

/// One compiled CEL expression and the text it was compiled from.
#[derive(Clone)]
pub struct Cel {
    text: String,
    expression: Arc<cel::parser::Expression>,
}

impl fmt::Debug for Cel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Cel").field(&self.text).finish()
    }
}

impl PartialEq for Cel {
    /// Two expressions are the same when their texts are.
    fn eq(&self, other: &Cel) -> bool {
        self.text == other.text
    }
}

/// Why a CEL expression cannot be used: it does not parse, or calls a function CEL does not
/// have. The message quotes the expression.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", quote(.text))]
pub struct CelError {
    pub text: String,
    pub message: String,
}

/// The functions and macros an expression may call: the `cel` crate's standard library
/// (Kubernetes' extension libraries are not part of it).
const FUNCTIONS: &[&str] = &[
    // Macros.
    "has",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    // The standard functions.
    "contains",
    "size",
    "max",
    "min",
    "startsWith",
    "endsWith",
    "string",
    "bytes",
    "double",
    "int",
    "uint",
    // `optional.of(x)` and its kin, which the parser reports by their last name.
    "none",
    "of",
    "ofNonZeroValue",
    "value",
    "hasValue",
    "or",
    "orValue",
    "matches",
    "duration",
    "timestamp",
    "getFullYear",
    "getMonth",
    "getDayOfYear",
    "getDayOfMonth",
    "getDate",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
];

/// The longest expression accepted, as Kubernetes bounds a validation rule's cost.
pub const MAX_EXPRESSION: usize = 4096;

impl Cel {
    /// Parses `text`.
    ///
    /// # Errors
    ///
    /// A [`CelError`] quoting the text: a syntax error with its line and column, a call of a
    /// function CEL does not have, an empty or too long expression.
    pub fn compile(text: &str) -> Result<Cel, CelError> {
        let error = |message: String| CelError {
            text: text.to_string(),
            message,
        };
        if text.trim().is_empty() {
            return Err(error("the expression is empty".to_string()));
        }
        if text.len() > MAX_EXPRESSION {
            return Err(error(format!(
                "the expression is {} bytes long; at most {MAX_EXPRESSION} are accepted",
                text.len()
            )));
        }
        let expression = cel::parser::Parser::new()
            .parse(text)
            .map_err(|e| error(parse_errors(&e)))?;
        let references = expression.references();
        if let Some(unknown) = references
            .functions()
            .into_iter()
            .find(|f| !FUNCTIONS.contains(f) && !is_operator(f))
        {
            return Err(error(format!("unknown function {unknown}")));
        }
        Ok(Cel {
            text: text.to_string(),
            expression: Arc::new(expression),
        })
    }

    /// The text it was compiled from.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Evaluates the expression over `object` (`self`, and its top-level fields by name), with
    /// `extra` variables besides (`dep` for a `dependsOn` readyExpr).
    ///
    /// # Errors
    ///
    /// What went wrong, in words (`no such key: readyReplicas`, `the expression is a string,
    /// not a boolean`): an object whose status lacks a field the expression reads is not an
    /// error of the expression, and the caller keeps waiting.
    pub fn holds(&self, object: &Value, extra: &[(&str, &Value)]) -> Result<bool, String> {
        let mut context = cel::Context::default();
        let converted = to_cel(&without_managed_fields(object));
        if let cel::Value::Map(map) = &converted {
            for (key, value) in map.map.iter() {
                if let Key::String(name) = key {
                    context.add_variable_from_value(name.as_str(), value.clone());
                }
            }
        }
        context.add_variable_from_value("self", converted);
        for (name, value) in extra {
            context.add_variable_from_value(*name, to_cel(&without_managed_fields(value)));
        }
        match context.resolve(&self.expression) {
            Ok(cel::Value::Bool(holds)) => Ok(holds),
            Ok(other) => Err(format!(
                "the expression is {}, not a boolean",
                article(&other.type_of().to_string())
            )),
            Err(e) => Err(execution_error(&e)),
        }
    }

    /// `InProgress` or `Ready` for the `sequenced.dev/ready-when` annotation: ready when it
    /// holds, waiting (with why) when it is false or cannot be evaluated yet.
    pub fn waiting_reason(&self, object: &Value) -> Option<String> {
        match self.holds(object, &[]) {
            Ok(true) => None,
            Ok(false) => Some(format!("{} (false)", quote(&self.text))),
            Err(why) => Some(format!("{} ({why})", quote(&self.text))),
        }
    }
}

/// Whether a name the parser reports as a function is one of CEL's operators (`_+_`,
/// `_[_]`, `!_`, `@in`, `_?._`), which every expression may use.
fn is_operator(name: &str) -> bool {
    name.starts_with('_') || name.starts_with('!') || name.starts_with('@')
}

fn article(word: &str) -> String {
    match word.chars().next() {
        Some('a' | 'e' | 'i' | 'o' | 'u') => format!("an {word}"),
        _ => format!("a {word}"),
    }
}

fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The parser's errors, each as `syntax error at line:column: what`.
fn parse_errors(errors: &cel::ParseErrors) -> String {
    let each: Vec<String> = errors
        .errors
        .iter()
        .map(|e| {
            let what = e
                .msg
                .strip_prefix("Syntax error: ")
                .unwrap_or(&e.msg)
                .trim();
            format!("syntax error at {}:{}: {what}", e.pos.0, e.pos.1)
        })
        .collect();
    if each.is_empty() {
        one_line(&errors.to_string())
    } else {
        each.join("; ")
    }
}

fn execution_error(error: &cel::ExecutionError) -> String {
    match error {
        cel::ExecutionError::NoSuchKey(key) => format!("no such key: {key}"),
        cel::ExecutionError::UndeclaredReference(name) => {
            format!("no such field or variable: {name}")
        }
        other => one_line(&other.to_string()),
    }
}

/// The object without `metadata.managedFields`, which no readiness rule reads and which is
/// often most of an object.
fn without_managed_fields(object: &Value) -> std::borrow::Cow<'_, Value> {
    match object.pointer("/metadata/managedFields") {
        None => std::borrow::Cow::Borrowed(object),
        Some(_) => {
            let mut owned = object.clone();
            if let Some(metadata) = owned.get_mut("metadata").and_then(Value::as_object_mut) {
                metadata.remove("managedFields");
            }
            std::borrow::Cow::Owned(owned)
        }
    }
}

/// A JSON value as CEL sees it: integers as `int` (as Kubernetes' CEL reads JSON), others as
/// `double`.
fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => cel::Value::Int(i),
            None => match n.as_u64() {
                Some(u) => cel::Value::UInt(u),
                None => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(map) => {
            let converted: HashMap<Key, cel::Value> = map
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            cel::Value::Map(Map {
                map: Arc::new(converted),
            })
        }
    }
}

/// Flux's `healthCheckExprs` entry for one kind, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheck {
    /// The API group the entry's apiVersion names (`` for the core group).
    pub group: String,
    pub kind: String,
    pub current: Cel,
    pub in_progress: Option<Cel>,
    pub failed: Option<Cel>,
}

/// The texts of one `healthCheckExprs` entry, as the spec has them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HealthCheckText<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub current: &'a str,
    pub in_progress: Option<&'a str>,
    pub failed: Option<&'a str>,
}

impl HealthCheck {
    /// Compiles one entry.
    ///
    /// # Errors
    ///
    /// Which expression (`current`, `inProgress`, `failed`) does not compile, and why.
    pub fn compile(text: HealthCheckText<'_>) -> Result<HealthCheck, (&'static str, CelError)> {
        let optional = |field: &'static str, text: Option<&str>| {
            text.filter(|t| !t.is_empty())
                .map(|t| Cel::compile(t).map_err(|e| (field, e)))
                .transpose()
        };
        Ok(HealthCheck {
            group: text
                .api_version
                .rsplit_once('/')
                .map_or("", |(group, _)| group)
                .to_string(),
            kind: text.kind.to_string(),
            current: Cel::compile(text.current).map_err(|e| ("current", e))?,
            in_progress: optional("inProgress", text.in_progress)?,
            failed: optional("failed", text.failed)?,
        })
    }

    /// Judges `object` as Flux does: a status written for an older generation is in progress;
    /// then `inProgress`, `failed` and `current`, the first that holds decides; none holds: in
    /// progress. An expression that cannot be evaluated (a field not there yet) is in progress,
    /// naming it, and the readiness timeout decides in the end.
    pub fn judge(&self, object: &Value) -> Verdict {
        if let Some(verdict) = super::kinds::generation_not_observed(object) {
            return verdict;
        }
        let mut unknown = Vec::new();
        let steps = [
            ("inProgress", self.in_progress.as_ref()),
            ("failed", self.failed.as_ref()),
            ("current", Some(&self.current)),
        ];
        for (field, expression) in steps {
            let Some(expression) = expression else {
                continue;
            };
            match expression.holds(object, &[]) {
                Ok(false) => {}
                Ok(true) => {
                    let said = format!(
                        "healthCheckExprs {field} {} is true",
                        quote(expression.text())
                    );
                    return match field {
                        "inProgress" => Verdict::InProgress(said),
                        "failed" => Verdict::Failed(said),
                        _ => Verdict::Ready,
                    };
                }
                Err(why) => unknown.push(format!("{field} {} ({why})", quote(expression.text()))),
            }
        }
        if unknown.is_empty() {
            Verdict::InProgress(format!(
                "waiting for healthCheckExprs current {} (false)",
                quote(self.current.text())
            ))
        } else {
            Verdict::InProgress(format!(
                "waiting for healthCheckExprs: {}",
                unknown.join("; ")
            ))
        }
    }
}

/// The `healthCheckExprs` of a spec, compiled; found by API group and kind (whatever the
/// version, as the same objects are served at every version).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HealthChecks {
    checks: Vec<HealthCheck>,
}

/// No health checks.
pub static NO_HEALTH_CHECKS: HealthChecks = HealthChecks { checks: Vec::new() };

impl HealthChecks {
    pub fn new(checks: Vec<HealthCheck>) -> HealthChecks {
        HealthChecks { checks }
    }

    pub fn is_empty(&self) -> bool {
        self.checks.is_empty()
    }

    /// The check for objects of this group and kind (the first entry, when several name it).
    pub fn for_kind(&self, group: &str, kind: &str) -> Option<&HealthCheck> {
        self.checks
            .iter()
            .find(|c| c.kind == kind && c.group == group)
    }

    /// The check for `object`, by its apiVersion and kind.
    pub fn for_object(&self, object: &Value) -> Option<&HealthCheck> {
        if self.checks.is_empty() {
            return None;
        }
        let kind = object.get("kind").and_then(Value::as_str)?;
        let api_version = object.get("apiVersion").and_then(Value::as_str)?;
        let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
        self.for_kind(group, kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn holds(text: &str, object: &Value) -> Result<bool, String> {
        Cel::compile(text).unwrap().holds(object, &[])
    }

    #[test]
    fn the_object_is_self_and_its_fields_are_variables() {
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "generation": 2}, "data": {"ok": "yes"},
            "status": {"replicas": 3, "ratio": 0.5}});
        assert_eq!(holds("self.data.ok == 'yes'", &object), Ok(true));
        assert_eq!(
            holds("data.ok == 'yes' && kind == 'ConfigMap'", &object),
            Ok(true)
        );
        // JSON integers are ints, as Kubernetes' CEL reads them.
        assert_eq!(
            holds("status.replicas == 3 && status.replicas > 2", &object),
            Ok(true)
        );
        assert_eq!(holds("status.ratio < 1.0", &object), Ok(true));
        assert_eq!(holds("has(self.status.ready)", &object), Ok(false));
        // This interpreter gets `a.?b` wrong when `b` is missing: the syntax is refused.
        assert!(
            Cel::compile("self.status.?ready.orValue(false)")
                .unwrap_err()
                .message
                .contains("unsupported syntax '.?'")
        );
        assert_eq!(
            holds(
                "has(self.status.ready) ? self.status.ready : false",
                &object
            ),
            Ok(false)
        );
        assert_eq!(
            holds("status.ready == true", &object),
            Err("no such key: ready".to_string())
        );
        assert_eq!(
            holds("self.metadata.name", &object),
            Err("the expression is a string, not a boolean".to_string())
        );
    }

    #[test]
    fn bad_expressions_are_refused_quoting_them() {
        let error = Cel::compile("self.status.ready ==").unwrap_err();
        assert!(
            error.to_string().starts_with("\"self.status.ready ==\": "),
            "{error}"
        );
        let error = Cel::compile("self.status.conditions.exist(c, c.type == 'Ready')").unwrap_err();
        assert_eq!(error.message, "unknown function exist");
        assert!(Cel::compile("  ").is_err());
        assert!(Cel::compile(&"a".repeat(MAX_EXPRESSION + 1)).is_err());
        let ok = Cel::compile(
            "self.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')",
        );
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn health_checks_judge_in_flux_order() {
        let check = HealthCheck::compile(HealthCheckText {
            api_version: "example.com/v1",
            kind: "Database",
            current: "status.phase == 'Ready'",
            in_progress: Some("status.phase == 'Creating'"),
            failed: Some("status.phase == 'Error' || status.phase == 'Creating'"),
        })
        .unwrap();
        let db = |phase: &str| {
            json!({"apiVersion": "example.com/v1", "kind": "Database",
            "metadata": {"name": "db", "generation": 1}, "status": {"phase": phase, "observedGeneration": 1}})
        };
        assert_eq!(check.judge(&db("Ready")), Verdict::Ready);
        assert!(
            check
                .judge(&db("Creating"))
                .reason()
                .unwrap()
                .contains("inProgress")
        );
        assert!(check.judge(&db("Error")).is_failed());
        assert!(matches!(check.judge(&db("Other")), Verdict::InProgress(_)));
        let mut old = db("Ready");
        old["metadata"]["generation"] = json!(2);
        assert!(matches!(check.judge(&old), Verdict::InProgress(_)));
        let bare =
            json!({"apiVersion": "example.com/v1", "kind": "Database", "metadata": {"name": "db"}});
        let Verdict::InProgress(why) = check.judge(&bare) else {
            panic!("in progress without a status");
        };
        assert!(why.contains("no such field or variable: status"), "{why}");
        let checks = HealthChecks::new(vec![check]);
        assert!(checks.for_object(&bare).is_some());
        assert!(checks.for_kind("example.com", "Database").is_some());
        assert!(checks.for_kind("other.com", "Database").is_none());
    }
}
