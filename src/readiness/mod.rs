//! Readiness: is an object, as the API server returns it, Ready, still in progress, or failed?
//!
//! Pure: the object, its rules and the time it has been waited on come in as arguments; nothing
//! here reads a clock or does I/O.
//!
//! * **Built-in rules** follow kstatus for Deployment, StatefulSet, DaemonSet, ReplicaSet, Job,
//!   Pod, PersistentVolumeClaim, Service (type LoadBalancer), CustomResourceDefinition and
//!   PodDisruptionBudget, and its generic rule for every other kind (see [`kinds`]).
//! * **Custom rules** from annotations (see [`Rules`]): `helm.sh/readiness-success` and
//!   `helm.sh/readiness-failure` (expressions on `.status`, see [`expr`]),
//!   `kots.io/wait-for-properties` (values that must match), `kots.io/wait-for-ready`, and
//!   `sequenced.dev/ready-when` (a CEL expression over the object, see [`cel`]).
//! * **Health checks per kind** in CEL, Flux's `healthCheckExprs` ([`cel::HealthCheck`]),
//!   replacing the built-in rule of the kinds they name ([`assess_with`]).
//! * **Timeouts**: `helm.sh/readiness-timeout` overrides the release's `readinessTimeout`; an
//!   object still in progress after it is Failed.
//!
//! Reasons say what is missing, in words for the person reading `kubectl get`:
//! `Deployment web: 1 of 3 replicas available`.

pub mod cel;
pub mod duration;
pub mod expr;
mod kinds;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use cel::{Cel, CelError, HealthCheck, HealthChecks};
pub use duration::{DurationError, format_duration, parse_duration};
pub use expr::{Evaluation, Expression, ExpressionError, Property};

/// Expressions that make an object ready (any one true).
pub const SUCCESS_ANNOTATION: &str = "helm.sh/readiness-success";
/// Expressions that make an object failed (any one true; they win over success).
pub const FAILURE_ANNOTATION: &str = "helm.sh/readiness-failure";
/// How long to wait for this object, overriding the release's `readinessTimeout`.
pub const TIMEOUT_ANNOTATION: &str = "helm.sh/readiness-timeout";
/// KOTS: `PATH=VALUE` pairs (paths from the object root) that must all match.
pub const WAIT_FOR_PROPERTIES_ANNOTATION: &str = "kots.io/wait-for-properties";
/// KOTS: `'true'` makes later creation phases wait until this object is ready.
pub const WAIT_FOR_READY_ANNOTATION: &str = "kots.io/wait-for-ready";
/// A CEL expression over the object (`self`): it is ready when the expression is true.
pub const READY_WHEN_ANNOTATION: &str = "sequenced.dev/ready-when";

/// Whether an object is ready, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    Ready,
    /// Not ready yet; the reason says what is missing.
    InProgress(String),
    /// Will not become ready without a change; the reason says why.
    Failed(String),
}

impl Verdict {
    pub fn is_ready(&self) -> bool {
        matches!(self, Verdict::Ready)
    }

    pub fn is_failed(&self) -> bool {
        matches!(self, Verdict::Failed(_))
    }

    /// `Ready`, `InProgress` or `Failed`.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Ready => "Ready",
            Verdict::InProgress(_) => "InProgress",
            Verdict::Failed(_) => "Failed",
        }
    }

    /// The reason, for InProgress and Failed.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Verdict::Ready => None,
            Verdict::InProgress(reason) | Verdict::Failed(reason) => Some(reason),
        }
    }

    fn map_reason(self, f: impl FnOnce(String) -> String) -> Verdict {
        match self {
            Verdict::Ready => Verdict::Ready,
            Verdict::InProgress(reason) => Verdict::InProgress(f(reason)),
            Verdict::Failed(reason) => Verdict::Failed(f(reason)),
        }
    }
}

impl fmt::Display for Verdict {
    /// `Ready`, `InProgress: reason`, `Failed: reason`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            None => f.write_str(self.name()),
            Some(reason) => write!(f, "{}: {reason}", self.name()),
        }
    }
}

/// Why the readiness annotations of an object cannot be used. Every message names the
/// annotation and quotes its text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("annotation {annotation}: {}", in_context(.text, .source))]
    Expression {
        annotation: &'static str,
        text: String,
        #[source]
        source: ExpressionError,
    },
    #[error("annotation {TIMEOUT_ANNOTATION}: {source}")]
    Timeout {
        #[source]
        source: DurationError,
    },
    #[error(
        "annotation {WAIT_FOR_READY_ANNOTATION}: {} is not a boolean (write \"true\" or \"false\")",
        expr::quote(.text)
    )]
    WaitForReady { text: String },
    #[error("annotation {READY_WHEN_ANNOTATION}: {source}")]
    ReadyWhen {
        #[source]
        source: CelError,
    },
    #[error(
        "annotation {annotation}: the value is {found}; annotation values are strings, so quote it"
    )]
    NotAString {
        annotation: String,
        found: &'static str,
    },
}

/// The expression error, followed by the whole annotation text when the error does not quote
/// all of it already.
fn in_context(text: &str, source: &ExpressionError) -> String {
    let quoted = expr::quote(text);
    if source.message.starts_with(&format!("{quoted}:")) {
        source.message.clone()
    } else {
        format!("{} (in {quoted})", source.message)
    }
}

impl RuleError {
    /// A fixed short category, for metrics labels.
    pub fn category(&self) -> &'static str {
        match self {
            RuleError::Expression { annotation, .. }
                if *annotation == WAIT_FOR_PROPERTIES_ANNOTATION =>
            {
                "bad_wait_for_properties"
            }
            RuleError::Expression { .. } => "bad_readiness_expression",
            RuleError::Timeout { .. } => "bad_readiness_timeout",
            RuleError::WaitForReady { .. } => "bad_wait_for_ready",
            RuleError::ReadyWhen { .. } => "bad_ready_when",
            RuleError::NotAString { .. } => "bad_annotation",
        }
    }
}

/// The custom readiness rules of one object, parsed from its annotations.
///
/// * Failure expressions (`helm.sh/readiness-failure`): any one true makes the object Failed.
///   They are checked before everything else and win over success.
/// * Success expressions (`helm.sh/readiness-success`, any one true) and KOTS properties
///   (`kots.io/wait-for-properties`, all must match) replace the built-in rule of the kind;
///   when both are given, both must hold.
/// * `helm.sh/readiness-timeout` overrides the release's timeout for this object.
/// * `kots.io/wait-for-ready` changes nothing here (the built-in rule applies); the planner reads
///   it with [`Rules::wait_for_ready`].
/// * `sequenced.dev/ready-when` (CEL, compiled when the rules are read) must hold too, and
///   replaces the built-in rule as success expressions do.
///
/// A status written for an older generation (`status.observedGeneration` below
/// `metadata.generation`) is never read, by custom rules either: the object is in progress
/// until its controller has caught up.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rules {
    success: Vec<Expression>,
    failure: Vec<Expression>,
    properties: Vec<Property>,
    timeout: Option<Duration>,
    wait_for_ready: Option<bool>,
    ready_when: Option<Cel>,
    completion: bool,
}

impl Rules {
    /// Parses the readiness annotations of one object: `helm.sh/readiness-success`,
    /// `helm.sh/readiness-failure`, `helm.sh/readiness-timeout`, `kots.io/wait-for-properties`,
    /// `kots.io/wait-for-ready` and `sequenced.dev/ready-when` (compiled here, once). Other
    /// annotations are ignored.
    ///
    /// # Errors
    ///
    /// Returns a [`RuleError`] naming the annotation and quoting the bad text.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Rules, RuleError> {
        let expressions = |annotation: &'static str| -> Result<Vec<Expression>, RuleError> {
            match annotations.get(annotation) {
                None => Ok(Vec::new()),
                Some(text) => {
                    expr::parse_expressions(text).map_err(|source| RuleError::Expression {
                        annotation,
                        text: text.clone(),
                        source,
                    })
                }
            }
        };
        let success = expressions(SUCCESS_ANNOTATION)?;
        let failure = expressions(FAILURE_ANNOTATION)?;
        let properties = match annotations.get(WAIT_FOR_PROPERTIES_ANNOTATION) {
            None => Vec::new(),
            Some(text) => expr::parse_properties(text).map_err(|source| RuleError::Expression {
                annotation: WAIT_FOR_PROPERTIES_ANNOTATION,
                text: text.clone(),
                source,
            })?,
        };
        let timeout = annotations
            .get(TIMEOUT_ANNOTATION)
            .map(|text| parse_duration(text))
            .transpose()
            .map_err(|source| RuleError::Timeout { source })?;
        let wait_for_ready = annotations
            .get(WAIT_FOR_READY_ANNOTATION)
            .map(|text| {
                parse_bool(text).ok_or_else(|| RuleError::WaitForReady { text: text.clone() })
            })
            .transpose()?;
        let ready_when = annotations
            .get(READY_WHEN_ANNOTATION)
            .map(|text| Cel::compile(text))
            .transpose()
            .map_err(|source| RuleError::ReadyWhen { source })?;
        Ok(Rules {
            success,
            failure,
            properties,
            timeout,
            wait_for_ready,
            ready_when,
            completion: false,
        })
    }

    /// Reads the rules from the object's own `metadata.annotations`.
    ///
    /// Annotation values on an API server are always strings. For objects written by hand (the
    /// `ready` command), a readiness annotation written as a YAML list (the sequencing
    /// proposal's `helm.sh/readiness-success: ["succeeded==1"]`) is taken as that list, and a
    /// number or boolean as its text.
    ///
    /// # Errors
    ///
    /// Returns a [`RuleError`] as [`Rules::from_annotations`] does, or when a readiness
    /// annotation is an object or a list of non-strings.
    pub fn from_object(object: &Value) -> Result<Rules, RuleError> {
        Rules::from_annotations(&annotations_of(object)?)
    }

    /// For hooks, which wait for completion: a Pod is ready only once it has Succeeded (a
    /// Running Pod stays in progress). Jobs are ready only when Complete in any case.
    #[must_use]
    pub fn require_completion(mut self) -> Rules {
        self.completion = true;
        self
    }

    /// The `helm.sh/readiness-timeout` override.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The timeout that applies: the override, else the release's `readinessTimeout`.
    pub fn effective_timeout(&self, default_timeout: Duration) -> Duration {
        self.timeout.unwrap_or(default_timeout)
    }

    /// Whether success expressions, KOTS properties or `sequenced.dev/ready-when` replace the
    /// built-in rule of the kind (and a health check of `spec.healthCheckExprs`). Failure
    /// expressions alone do not: they are checked on top of the built-in rule.
    pub fn is_custom(&self) -> bool {
        !self.success.is_empty() || !self.properties.is_empty() || self.ready_when.is_some()
    }

    /// `sequenced.dev/ready-when`, compiled.
    pub fn ready_when(&self) -> Option<&Cel> {
        self.ready_when.as_ref()
    }

    /// Whether the object carries any readiness annotation at all.
    pub fn is_empty(&self) -> bool {
        *self == Rules::default()
    }

    /// `kots.io/wait-for-ready`, when given.
    pub fn wait_for_ready(&self) -> Option<bool> {
        self.wait_for_ready
    }

    /// Whether the object asks that later phases wait for it (KOTS): `kots.io/wait-for-ready:
    /// "true"` or `kots.io/wait-for-properties`.
    pub fn waits_in_kots_phases(&self) -> bool {
        self.wait_for_ready == Some(true) || !self.properties.is_empty()
    }

    pub fn success_expressions(&self) -> &[Expression] {
        &self.success
    }

    pub fn failure_expressions(&self) -> &[Expression] {
        &self.failure
    }

    pub fn properties(&self) -> &[Property] {
        &self.properties
    }
}

/// The readiness annotations of an object as strings (see [`Rules::from_object`]).
/// The annotations that say how an object's readiness is judged.
pub const RULE_ANNOTATIONS: [&str; 6] = [
    SUCCESS_ANNOTATION,
    FAILURE_ANNOTATION,
    TIMEOUT_ANNOTATION,
    WAIT_FOR_PROPERTIES_ANNOTATION,
    WAIT_FOR_READY_ANNOTATION,
    READY_WHEN_ANNOTATION,
];

/// What [`Rules::from_object`] reads of `object`, and nothing else: its readiness annotations,
/// or null when it has none (a cached plan keeps this much of a Ready release's objects).
pub fn rules_only(object: &Value) -> Value {
    let Some(map) = object
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    else {
        return Value::Null;
    };
    let kept: serde_json::Map<String, Value> = map
        .iter()
        .filter(|(key, _)| RULE_ANNOTATIONS.contains(&key.as_str()))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    if kept.is_empty() {
        return Value::Null;
    }
    serde_json::json!({"metadata": {"annotations": kept}})
}

fn annotations_of(object: &Value) -> Result<BTreeMap<String, String>, RuleError> {
    let mut annotations = BTreeMap::new();
    let Some(map) = object
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    else {
        return Ok(annotations);
    };
    for (key, value) in map {
        if !RULE_ANNOTATIONS.contains(&key.as_str()) {
            continue;
        }
        let not_a_string = |found: &'static str| RuleError::NotAString {
            annotation: key.clone(),
            found,
        };
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Null => continue,
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => n.to_string(),
            Value::Array(items) if items.iter().all(Value::is_string) => value.to_string(),
            Value::Array(_) => return Err(not_a_string("a list of non-strings")),
            Value::Object(_) => return Err(not_a_string("a mapping")),
        };
        annotations.insert(key.clone(), text);
    }
    Ok(annotations)
}

/// Go's `strconv.ParseBool`, as KOTS reads `kots.io/wait-for-ready`.
fn parse_bool(text: &str) -> Option<bool> {
    match text.trim() {
        "1" | "t" | "T" | "true" | "True" | "TRUE" => Some(true),
        "0" | "f" | "F" | "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// `Deployment web`: how reasons name an object.
pub fn describe(object: &Value) -> String {
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
        .unwrap_or("object");
    match object.pointer("/metadata/name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => format!("{kind} {name}"),
        _ => kind.to_string(),
    }
}

/// Whether an object of this kind, with no readiness rules, is judged from its metadata alone
/// (whether it exists and is being deleted): kinds that have no status, unless a health check
/// of `spec.healthCheckExprs` names the kind.
pub fn judged_by_metadata(group: &str, kind: &str, rules: &Rules, health: &HealthChecks) -> bool {
    !rules.is_custom()
        && rules.failure.is_empty()
        && kinds::ready_once_it_exists(group, kind)
        && health.for_kind(group, kind).is_none()
}

/// Judges an object now, without timeouts, with reasons that do not name the object
/// (`1 of 3 replicas available`). [`check`] is this plus the name and the timeout.
pub fn assess(object: &Value, rules: &Rules) -> Verdict {
    assess_with(object, rules, None)
}

/// [`assess`], with the health check of `spec.healthCheckExprs` for the object's kind, when
/// there is one: it replaces the built-in rule of the kind, and annotations on the object
/// (which say more about this one object) replace it.
pub fn assess_with(object: &Value, rules: &Rules, health: Option<&HealthCheck>) -> Verdict {
    let kind_rule = || match health {
        Some(check) => check.judge(object),
        None => kinds::builtin(object, rules.completion),
    };
    if object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        return Verdict::InProgress("being deleted (metadata.deletionTimestamp is set)".into());
    }
    if !rules.is_custom() && rules.failure.is_empty() {
        return kind_rule();
    }
    if let (Some(generation), Some(observed)) = (
        object
            .pointer("/metadata/generation")
            .and_then(Value::as_i64),
        object
            .pointer("/status/observedGeneration")
            .and_then(Value::as_i64),
    ) && observed < generation
    {
        return Verdict::InProgress(format!(
            "generation {generation} not yet observed by its controller (status is for generation {observed})"
        ));
    }
    for expression in &rules.failure {
        let evaluation = expression.evaluate(object);
        if evaluation.holds {
            return Verdict::Failed(format!(
                "failure condition {} is true ({})",
                expression.text(),
                evaluation.observed()
            ));
        }
    }
    if !rules.is_custom() {
        return kind_rule();
    }
    let mut waiting = Vec::new();
    if !rules.success.is_empty() {
        let evaluations: Vec<(&Expression, Evaluation<'_>)> = rules
            .success
            .iter()
            .map(|e| (e, e.evaluate(object)))
            .collect();
        if !evaluations.iter().any(|(_, evaluation)| evaluation.holds) {
            let each: Vec<String> = evaluations
                .iter()
                .map(|(e, evaluation)| format!("{} ({})", e.text(), evaluation.observed()))
                .collect();
            waiting.push(if each.len() == 1 {
                each.concat()
            } else {
                format!("one of {}", each.join(", "))
            });
        }
    }
    for property in &rules.properties {
        let evaluation = property.evaluate(object);
        if !evaluation.holds {
            waiting.push(format!("{} ({})", property.text(), evaluation.observed()));
        }
    }
    if let Some(reason) = rules
        .ready_when
        .as_ref()
        .and_then(|c| c.waiting_reason(object))
    {
        waiting.push(format!("{READY_WHEN_ANNOTATION} {reason}"));
    }
    if waiting.is_empty() {
        Verdict::Ready
    } else {
        Verdict::InProgress(format!("waiting for {}", waiting.join("; ")))
    }
}

/// Judges an object: Ready, InProgress or Failed, with a reason that names it
/// (`Deployment web: 1 of 3 replicas available`).
///
/// `waited` is how long this object has been waited on so far (the caller computes it from
/// the timestamps it keeps; `None` when not timed). An object still in progress once it has
/// waited its timeout (`helm.sh/readiness-timeout`, else `default_timeout`, the release's
/// `readinessTimeout`) is Failed: `readiness timeout after 20s: Deployment web: 1 of 3
/// replicas available`. Ready and Failed do not depend on the time.
///
/// ```
/// use std::time::Duration;
/// use sequenced::readiness::{Rules, Verdict, check};
///
/// let job = serde_json::json!({
///     "apiVersion": "batch/v1",
///     "kind": "Job",
///     "metadata": {
///         "name": "barz",
///         "annotations": {
///             "helm.sh/readiness-success": "[\"succeeded==1\"]",
///             "helm.sh/readiness-timeout": "20s",
///         },
///     },
///     "status": {"active": 1, "succeeded": 0},
/// });
/// let rules = Rules::from_object(&job)?;
/// let release_timeout = Duration::from_secs(300);
/// assert_eq!(
///     check(&job, &rules, Some(Duration::from_secs(5)), release_timeout),
///     Verdict::InProgress("Job barz: waiting for succeeded==1 (status.succeeded is 0)".into())
/// );
/// assert_eq!(
///     check(&job, &rules, Some(Duration::from_secs(21)), release_timeout),
///     Verdict::Failed(
///         "readiness timeout after 20s: Job barz: waiting for succeeded==1 (status.succeeded is 0)"
///             .into()
///     )
/// );
/// # Ok::<(), sequenced::readiness::RuleError>(())
/// ```
pub fn check(
    object: &Value,
    rules: &Rules,
    waited: Option<Duration>,
    default_timeout: Duration,
) -> Verdict {
    check_with(object, rules, None, waited, default_timeout)
}

/// [`check`] with the health check of `spec.healthCheckExprs` for the object's kind (see
/// [`assess_with`]).
pub fn check_with(
    object: &Value,
    rules: &Rules,
    health: Option<&HealthCheck>,
    waited: Option<Duration>,
    default_timeout: Duration,
) -> Verdict {
    let name = describe(object);
    let verdict =
        assess_with(object, rules, health).map_reason(|reason| format!("{name}: {reason}"));
    match (verdict, waited) {
        (Verdict::InProgress(reason), Some(waited))
            if waited >= rules.effective_timeout(default_timeout) =>
        {
            Verdict::Failed(format!(
                "readiness timeout after {}: {reason}",
                format_duration(rules.effective_timeout(default_timeout))
            ))
        }
        (verdict, _) => verdict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_only_keeps_what_the_rules_are_read_from() {
        let judged = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "annotations": {
                "helm.sh/readiness-success": "[\"{.data.ok} == 'yes'\"]",
                "helm.sh/readiness-timeout": "30s",
                "meta.helm.sh/release-name": "shop"}},
            "data": {"ok": "yes"}});
        let kept = rules_only(&judged);
        assert_eq!(
            format!("{:?}", Rules::from_object(&kept)),
            format!("{:?}", Rules::from_object(&judged))
        );
        assert!(kept.pointer("/data").is_none());
        assert!(
            kept.pointer("/metadata/annotations/meta.helm.sh~1release-name")
                .is_none()
        );
        let plain =
            json!({"kind": "ConfigMap", "metadata": {"name": "b", "annotations": {"x/y": "z"}}});
        assert_eq!(rules_only(&plain), Value::Null);
        assert_eq!(
            format!("{:?}", Rules::from_object(&Value::Null)),
            format!("{:?}", Rules::from_object(&plain))
        );
    }

    #[test]
    fn verdicts_serialise_with_their_reason() {
        for (verdict, text) in [
            (Verdict::Ready, r#""Ready""#),
            (
                Verdict::InProgress("1 of 3 replicas available".into()),
                r#"{"InProgress":"1 of 3 replicas available"}"#,
            ),
            (Verdict::Failed("failed".into()), r#"{"Failed":"failed"}"#),
        ] {
            assert_eq!(serde_json::to_string(&verdict).unwrap(), text);
            assert_eq!(serde_json::from_str::<Verdict>(text).unwrap(), verdict);
        }
    }

    #[test]
    fn objects_are_named_by_kind_and_name() {
        assert_eq!(
            describe(&json!({"kind": "Job", "metadata": {"name": "migrate"}})),
            "Job migrate"
        );
        assert_eq!(describe(&json!({"kind": "Job"})), "Job");
        assert_eq!(describe(&json!({"metadata": {"name": "x"}})), "object x");
    }

    #[test]
    fn the_annotation_text_is_quoted_once() {
        let error = |text: &str| {
            Rules::from_annotations(&BTreeMap::from([(
                SUCCESS_ANNOTATION.to_string(),
                text.to_string(),
            )]))
            .unwrap_err()
            .to_string()
        };
        assert_eq!(
            error("a = 1"),
            "annotation helm.sh/readiness-success: \"a = 1\": unknown operator \"=\" (did you mean ==?)"
        );
        assert_eq!(
            error("[\"a == 1\", \"b\"]"),
            "annotation helm.sh/readiness-success: \"b\": expected an operator (== != < <= > >=) \
             after the path .b, found the end of the text (in \"[\\\"a == 1\\\", \\\"b\\\"]\")"
        );
    }

    #[test]
    fn the_timeout_counts_from_the_override_or_the_default() {
        let rules = Rules::from_annotations(&BTreeMap::from([(
            TIMEOUT_ANNOTATION.to_string(),
            "20s".to_string(),
        )]))
        .unwrap();
        assert_eq!(rules.timeout(), Some(Duration::from_secs(20)));
        assert_eq!(
            rules.effective_timeout(Duration::from_secs(300)),
            Duration::from_secs(20)
        );
        assert_eq!(
            Rules::default().effective_timeout(Duration::from_secs(300)),
            Duration::from_secs(300)
        );
        assert!(!rules.is_custom() && !rules.is_empty());
    }
}
