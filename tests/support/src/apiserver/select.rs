//! Label selectors (`labelSelector=` strings and `LabelSelector` objects) and field selectors.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<Requirement>,
    /// `LabelSelector` objects can select nothing (never for strings).
    nothing: bool,
}

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => parts.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    parts.push(cur);
    parts
}

fn check_key(key: &str) -> Result<(), String> {
    let errs = super::validation::qualified_name(key);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "unable to parse requirement: <nil>: Invalid value: {}: {}",
            super::errors::quote(key),
            errs.join("; ")
        ))
    }
}

fn check_value(value: &str) -> Result<(), String> {
    let errs = super::validation::label_value(value);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "unable to parse requirement: <nil>: Invalid value: {}: {}",
            super::errors::quote(value),
            errs.join("; ")
        ))
    }
}

fn parse_set(rest: &str) -> Result<Vec<String>, String> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("found '{}', expected: '('", rest.trim()))?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    for v in &values {
        check_value(v)?;
    }
    Ok(values)
}

impl LabelSelector {
    /// Parses the string form (`a=b,c!=d,e in (f,g),!h,i`).
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector::default());
        }
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                return Err("found '', expected: !, identifier, or 'end of string'".into());
            }
            let req = if let Some(key) = p.strip_prefix('!') {
                let key = key.trim();
                check_key(key)?;
                Requirement {
                    key: key.into(),
                    op: Op::DoesNotExist,
                }
            } else if let Some((k, v)) = p.split_once("!=") {
                check_key(k.trim())?;
                check_value(v.trim())?;
                Requirement {
                    key: k.trim().into(),
                    op: Op::NotEq(v.trim().into()),
                }
            } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
                check_key(k.trim())?;
                check_value(v.trim())?;
                Requirement {
                    key: k.trim().into(),
                    op: Op::Eq(v.trim().into()),
                }
            } else if let Some((k, v)) = p.split_once('>') {
                check_key(k.trim())?;
                let n = v.trim().parse().map_err(|_| format!("unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: {}", v.trim()))?;
                Requirement {
                    key: k.trim().into(),
                    op: Op::Gt(n),
                }
            } else if let Some((k, v)) = p.split_once('<') {
                check_key(k.trim())?;
                let n = v.trim().parse().map_err(|_| format!("unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: {}", v.trim()))?;
                Requirement {
                    key: k.trim().into(),
                    op: Op::Lt(n),
                }
            } else if let Some(idx) = p.find(" notin ").or_else(|| p.find(" notin(")) {
                let key = p[..idx].trim();
                check_key(key)?;
                Requirement {
                    key: key.into(),
                    op: Op::NotIn(parse_set(&p[idx + 6..])?),
                }
            } else if let Some(idx) = p.find(" in ").or_else(|| p.find(" in(")) {
                let key = p[..idx].trim();
                check_key(key)?;
                Requirement {
                    key: key.into(),
                    op: Op::In(parse_set(&p[idx + 3..])?),
                }
            } else {
                if p.contains(char::is_whitespace) || p.contains('(') {
                    return Err(format!(
                        "unable to parse requirement: found '{p}', expected: in, notin, =, ==, !=, gt, lt"
                    ));
                }
                check_key(p)?;
                Requirement {
                    key: p.into(),
                    op: Op::Exists,
                }
            };
            reqs.push(req);
        }
        Ok(LabelSelector {
            reqs,
            nothing: false,
        })
    }

    /// Converts a `LabelSelector` object (matchLabels, matchExpressions).
    pub fn from_json(v: &Value) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        if v.is_null() {
            return Ok(LabelSelector {
                reqs,
                nothing: true,
            });
        }
        for (k, val) in v
            .get("matchLabels")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            reqs.push(Requirement {
                key: k.clone(),
                op: Op::Eq(val.as_str().unwrap_or("").into()),
            });
        }
        for e in v
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = e
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let values: Vec<String> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            let op = match e.get("operator").and_then(Value::as_str).unwrap_or("") {
                "In" => Op::In(values),
                "NotIn" => Op::NotIn(values),
                "Exists" => Op::Exists,
                "DoesNotExist" => Op::DoesNotExist,
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            };
            reqs.push(Requirement { key, op });
        }
        Ok(LabelSelector {
            reqs,
            nothing: false,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, labels: &[(String, String)]) -> bool {
        if self.nothing {
            return false;
        }
        let get = |k: &str| {
            labels
                .iter()
                .find(|(lk, _)| lk == k)
                .map(|(_, v)| v.as_str())
        };
        self.reqs.iter().all(|r| match &r.op {
            Op::Eq(v) => get(&r.key) == Some(v.as_str()),
            Op::NotEq(v) => get(&r.key) != Some(v.as_str()),
            Op::In(vs) => get(&r.key).is_some_and(|x| vs.iter().any(|v| v == x)),
            Op::NotIn(vs) => get(&r.key).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Op::Exists => get(&r.key).is_some(),
            Op::DoesNotExist => get(&r.key).is_none(),
            Op::Gt(n) => get(&r.key)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            Op::Lt(n) => get(&r.key)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }

    pub fn matches_object(&self, obj: &Value) -> bool {
        let labels: Vec<(String, String)> = obj
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                    .collect()
            })
            .unwrap_or_default();
        self.matches(&labels)
    }
}

/// A parsed field selector: `metadata.name=x,metadata.namespace!=y`.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector {
    reqs: Vec<(Vec<String>, bool, String)>,
}

/// The fields a kind can be selected on besides metadata.name and metadata.namespace.
fn extra_fields(group: &str, kind: &str) -> &'static [&'static str] {
    match (group, kind) {
        ("", "Pod") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "Secret") => &["type"],
        ("", "Namespace") => &["status.phase"],
        ("", "Node") => &["spec.unschedulable"],
        ("", "Event") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("events.k8s.io", "Event") => &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "regarding.apiVersion",
            "regarding.resourceVersion",
            "regarding.fieldPath",
            "reason",
            "reportingController",
            "type",
        ],
        ("", "ReplicationController") => &["status.replicas"],
        ("apps", "ReplicaSet") => &["status.replicas"],
        ("batch", "Job") => &["status.successful"],
        _ => &[],
    }
}

impl FieldSelector {
    pub fn parse(s: &str, group: &str, kind: &str) -> Result<FieldSelector, String> {
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                ));
            };
            let field = field.trim();
            if field != "metadata.name"
                && field != "metadata.namespace"
                && !extra_fields(group, kind).contains(&field)
            {
                return Err(format!("field label not supported: {field}"));
            }
            reqs.push((
                field.split('.').map(String::from).collect(),
                eq,
                value.trim().to_string(),
            ));
        }
        Ok(FieldSelector { reqs })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(path, eq, want)| {
            let mut cur = Some(obj);
            for p in path {
                cur = cur.and_then(|c| c.get(p));
            }
            let have = match cur {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(v) => v.to_string(),
            };
            (have == *want) == *eq
        })
    }
}
