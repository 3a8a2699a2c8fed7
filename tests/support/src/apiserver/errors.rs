//! `Status` bodies as kube-apiserver writes them (k8s.io/apimachinery/pkg/api/errors), and the
//! field errors of a 422 Invalid answer (k8s.io/apimachinery/pkg/util/validation/field).

use serde_json::{Map, Value, json};

/// An answer that is not a success: HTTP status code plus the `Status` object to send.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub body: Value,
    pub retry_after: Option<u32>,
}

/// The plural resource name as the server prints it: `configmaps`, `leases.coordination.k8s.io`.
pub fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

fn details(name: &str, group: &str, kind: &str) -> Value {
    let mut d = Map::new();
    if !name.is_empty() {
        d.insert("name".into(), json!(name));
    }
    if !group.is_empty() {
        d.insert("group".into(), json!(group));
    }
    if !kind.is_empty() {
        d.insert("kind".into(), json!(kind));
    }
    Value::Object(d)
}

impl ApiError {
    pub fn new(
        code: u16,
        reason: &str,
        message: impl Into<String>,
        details: Option<Value>,
    ) -> Self {
        let mut body = Map::new();
        body.insert("kind".into(), json!("Status"));
        body.insert("apiVersion".into(), json!("v1"));
        body.insert("metadata".into(), json!({}));
        body.insert("status".into(), json!("Failure"));
        let message = message.into();
        if !message.is_empty() {
            body.insert("message".into(), json!(message));
        }
        if !reason.is_empty() {
            body.insert("reason".into(), json!(reason));
        }
        if let Some(details) = details {
            body.insert("details".into(), details);
        }
        body.insert("code".into(), json!(code));
        ApiError {
            code,
            body: Value::Object(body),
            retry_after: None,
        }
    }

    /// `configmaps "nope" not found`
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, resource)),
            Some(details(name, group, resource)),
        )
    }

    /// What an unknown path gets.
    pub fn no_such_resource() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
            Some(json!({})),
        )
    }

    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, resource)),
            Some(details(name, group, resource)),
        )
    }

    /// `Operation cannot be fulfilled on configmaps "cm1": <why>`
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, resource)
            ),
            Some(details(name, group, resource)),
        )
    }

    /// The optimistic-concurrency conflict of a stale resourceVersion.
    pub fn modified(group: &str, resource: &str, name: &str) -> Self {
        Self::conflict(
            group,
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message, None)
    }

    pub fn internal(message: &str) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
            Some(json!({"causes": [{"message": message}]})),
        )
    }

    /// As apimachinery's `NewForbidden`: the name is left out of the message when there is
    /// none (a create by `generateName`, refused by admission before a name is generated).
    pub fn forbidden(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let what = if name.is_empty() {
            qualified(group, resource)
        } else {
            format!("{} \"{name}\"", qualified(group, resource))
        };
        Self::new(
            403,
            "Forbidden",
            format!("{what} is forbidden: {why}"),
            Some(details(name, group, resource)),
        )
    }

    /// NamespaceLifecycle admission: a create in a namespace being deleted.
    pub fn namespace_terminating(group: &str, resource: &str, name: &str, namespace: &str) -> Self {
        let mut error = Self::forbidden(
            group,
            resource,
            name,
            &format!(
                "unable to create new content in namespace {namespace} because it is being terminated"
            ),
        );
        if let Some(details) = error.body.get_mut("details").and_then(Value::as_object_mut) {
            details.insert(
                "causes".into(),
                json!([{
                    "reason": "NamespaceTerminating",
                    "message": format!("namespace {namespace} is being terminated"),
                    "field": "metadata.namespace",
                }]),
            );
        }
        error
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            Some(json!({})),
        )
    }

    pub fn unsupported_media_type(content_type: &str, accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
            Some(
                json!({"causes": [{"reason": "UnexpectedHeader", "message": format!("Content-Type: {content_type}")}]}),
            ),
        )
    }

    pub fn not_acceptable() -> Self {
        Self::new(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf",
            None,
        )
    }

    /// `410 Gone` with reason Expired, as a too old resourceVersion gets.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message, None)
    }

    /// 422 Invalid for an object of `kind` in `group`.
    pub fn invalid(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> Self {
        let mut unique: Vec<String> = Vec::new();
        for e in errors {
            let text = e.to_string();
            if !unique.contains(&text) {
                unique.push(text);
            }
        }
        let qualified_kind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let message = match unique.len() {
            0 => format!("{qualified_kind} \"{name}\" is invalid"),
            1 => format!("{qualified_kind} \"{name}\" is invalid: {}", unique[0]),
            _ => format!(
                "{qualified_kind} \"{name}\" is invalid: [{}]",
                unique.join(", ")
            ),
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.kind.reason(), "message": e.body(), "field": e.field}))
            .collect();
        let mut d = match details(name, group, kind) {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        d.insert("causes".into(), Value::Array(causes));
        Self::new(422, "Invalid", message, Some(Value::Object(d)))
    }

    /// What a status code injected by `fail_next` answers.
    pub fn injected(code: u16) -> Self {
        let (reason, message) = match code {
            400 => ("BadRequest", "injected failure".to_string()),
            401 => ("Unauthorized", "Unauthorized".to_string()),
            403 => ("Forbidden", "forbidden: injected failure".to_string()),
            404 => (
                "NotFound",
                "the server could not find the requested resource".to_string(),
            ),
            409 => (
                "Conflict",
                "Operation cannot be fulfilled: injected failure".to_string(),
            ),
            410 => ("Expired", "injected failure".to_string()),
            429 => (
                "TooManyRequests",
                "Too many requests, please try again later.".to_string(),
            ),
            500 => (
                "InternalError",
                "Internal error occurred: injected failure".to_string(),
            ),
            503 => (
                "ServiceUnavailable",
                "the server is currently unable to handle the request".to_string(),
            ),
            504 => (
                "Timeout",
                "the server was unable to return a response in the time allotted".to_string(),
            ),
            _ => (
                "",
                format!(
                    "the server responded with the status code {code} but did not return more information"
                ),
            ),
        };
        let details = (code == 429).then(|| json!({"retryAfterSeconds": 1}));
        let mut e = Self::new(code, reason, message, details);
        if code == 429 || code == 503 {
            e.retry_after = Some(1);
        }
        e
    }
}

/// The type of one field error, with the words Go prints for it.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldErrorKind {
    /// `Invalid value: <value>` (the value already printed the way Go prints it)
    Invalid(String),
    Required,
    Forbidden,
    TooLong,
    /// `Unsupported value: <value>`
    NotSupported(String),
    Duplicate(String),
    /// `Internal error` (Go's `field.InternalError`)
    Internal,
}

impl FieldErrorKind {
    pub fn reason(&self) -> &'static str {
        match self {
            FieldErrorKind::Invalid(_) => "FieldValueInvalid",
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::NotSupported(_) => "FieldValueNotSupported",
            FieldErrorKind::Duplicate(_) => "FieldValueDuplicate",
            FieldErrorKind::Internal => "InternalError",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub kind: FieldErrorKind,
    pub field: String,
    pub detail: String,
}

/// Prints a string value as Go's `%q` does (close enough: JSON escaping).
pub fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

impl FieldError {
    pub fn invalid(field: impl Into<String>, value: &str, detail: impl Into<String>) -> Self {
        FieldError {
            kind: FieldErrorKind::Invalid(quote(value)),
            field: field.into(),
            detail: detail.into(),
        }
    }

    /// Invalid with a value that Go prints without quotes (numbers, bools, structs).
    pub fn invalid_raw(
        field: impl Into<String>,
        value: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            kind: FieldErrorKind::Invalid(value.into()),
            field: field.into(),
            detail: detail.into(),
        }
    }

    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            kind: FieldErrorKind::Required,
            field: field.into(),
            detail: detail.into(),
        }
    }

    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            kind: FieldErrorKind::Forbidden,
            field: field.into(),
            detail: detail.into(),
        }
    }

    pub fn internal(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            kind: FieldErrorKind::Internal,
            field: field.into(),
            detail: detail.into(),
        }
    }

    pub fn too_long(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            kind: FieldErrorKind::TooLong,
            field: field.into(),
            detail: detail.into(),
        }
    }

    pub fn not_supported(field: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| quote(s)).collect();
        FieldError {
            kind: FieldErrorKind::NotSupported(quote(value)),
            field: field.into(),
            detail: format!("supported values: {}", list.join(", ")),
        }
    }

    /// What follows `field: ` in the message: `Invalid value: "x": detail`.
    pub fn body(&self) -> String {
        let mut s = match &self.kind {
            FieldErrorKind::Invalid(v) => format!("Invalid value: {v}"),
            FieldErrorKind::Required => "Required value".to_string(),
            FieldErrorKind::Forbidden => "Forbidden".to_string(),
            FieldErrorKind::TooLong => "Too long".to_string(),
            FieldErrorKind::NotSupported(v) => format!("Unsupported value: {v}"),
            FieldErrorKind::Duplicate(v) => format!("Duplicate value: {v}"),
            FieldErrorKind::Internal => "Internal error".to_string(),
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}
