//! The validation kube-apiserver does before it stores an object, with its messages
//! (k8s.io/apimachinery/pkg/util/validation and pkg/apis/core/validation).

use serde_json::{Map, Value};

use super::errors::{FieldError, quote};
use super::resources::{NameRule, ResourceType};
use super::select::LabelSelector;
use super::util::{at, str_at};

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut s = msg.to_string();
    if examples.is_empty() {
        return format!("{s} (regex used for validation is '{fmt}')");
    }
    s.push_str(" (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            s.push_str(" or ");
        }
        s.push_str(&format!("'{e}', "));
    }
    s.push_str(&format!("regex used for validation is '{fmt}')"));
    s
}

fn max_len(n: usize) -> String {
    format!("must be no more than {n} characters")
}

fn alnum_lower(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn is_label_shape(s: &str, first_alpha: bool) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (if first_alpha {
            b[0].is_ascii_lowercase()
        } else {
            alnum_lower(b[0])
        })
        && alnum_lower(b[b.len() - 1])
        && b.iter().all(|&c| alnum_lower(c) || c == b'-')
}

pub fn dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len(63));
    }
    if !is_label_shape(s, false) {
        errs.push(regex_error(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
            DNS1123_LABEL_FMT,
            &["my-name", "123-abc"],
        ));
    }
    errs
}

pub fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len(253));
    }
    if !s.split('.').all(|l| is_label_shape(l, false)) {
        errs.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

pub fn dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len(63));
    }
    if !is_label_shape(s, true) {
        errs.push(regex_error(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character",
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

fn path_segment(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s == "." || s == ".." {
        errs.push(format!("may not be '{s}'"));
    }
    for c in ["/", "%"] {
        if s.contains(c) {
            errs.push(format!("may not contain '{c}'"));
        }
    }
    errs
}

fn name_errors(rule: NameRule, name: &str, prefix: bool) -> Vec<String> {
    // A generateName prefix may end in '-': the random suffix follows.
    let name = if prefix {
        name.strip_suffix('-')
            .map(|n| format!("{n}a"))
            .unwrap_or(name.to_string())
    } else {
        name.to_string()
    };
    match rule {
        NameRule::Subdomain => dns1123_subdomain(&name),
        NameRule::Label => dns1123_label(&name),
        NameRule::Rfc1035 => dns1035_label(&name),
        NameRule::PathSegment => path_segment(&name),
    }
}

fn is_qualified_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
}

/// IsQualifiedName: `name` or `prefix/name`, the prefix a DNS subdomain.
pub fn qualified_name(value: &str) -> Vec<String> {
    let parts: Vec<&str> = value.split('/').collect();
    let mut errs = Vec::new();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            name
        }
        _ => {
            return vec![format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_MSG,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            )];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len(63)));
    }
    if !is_qualified_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

pub fn label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push(max_len(63));
    }
    if !value.is_empty() && !is_qualified_part(value) {
        errs.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

fn string_map(v: Option<&Value>) -> Vec<(&str, &str)> {
    let mut out: Vec<(&str, &str)> = v
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

pub fn validate_labels(labels: Option<&Value>, field: &str, errs: &mut Vec<FieldError>) {
    for (k, v) in string_map(labels) {
        for msg in qualified_name(k) {
            errs.push(FieldError::invalid(field, k, msg));
        }
        for msg in label_value(v) {
            errs.push(FieldError::invalid(field, v, msg));
        }
    }
}

pub fn validate_annotations(annotations: Option<&Value>, field: &str, errs: &mut Vec<FieldError>) {
    let entries = string_map(annotations);
    let mut size = 0;
    for (k, v) in &entries {
        for msg in qualified_name(&k.to_lowercase()) {
            errs.push(FieldError::invalid(field, k, msg));
        }
        size += k.len() + v.len();
    }
    if size > 256 * 1024 {
        errs.push(FieldError::too_long(
            field,
            "must have at most 262144 bytes",
        ));
    }
}

/// ValidateObjectMeta for an object of `rt` (namespace presence included).
pub fn validate_meta(rt: &ResourceType, obj: &Value, errs: &mut Vec<FieldError>) {
    let empty = Map::new();
    let meta = obj
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let s = |k: &str| meta.get(k).and_then(Value::as_str).unwrap_or("");
    let rule = rt.name_rule();
    if !s("generateName").is_empty() {
        for msg in name_errors(rule, s("generateName"), true) {
            errs.push(FieldError::invalid(
                "metadata.generateName",
                s("generateName"),
                msg,
            ));
        }
    }
    if s("name").is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        for msg in name_errors(rule, s("name"), false) {
            errs.push(FieldError::invalid("metadata.name", s("name"), msg));
        }
    }
    if rt.namespaced {
        if s("namespace").is_empty() {
            errs.push(FieldError::required("metadata.namespace", ""));
        } else {
            for msg in dns1123_label(s("namespace")) {
                errs.push(FieldError::invalid(
                    "metadata.namespace",
                    s("namespace"),
                    msg,
                ));
            }
        }
    } else if !s("namespace").is_empty() {
        errs.push(FieldError::forbidden(
            "metadata.namespace",
            "not allowed on this type",
        ));
    }
    validate_labels(meta.get("labels"), "metadata.labels", errs);
    validate_annotations(meta.get("annotations"), "metadata.annotations", errs);
    if let Some(refs) = meta.get("ownerReferences").and_then(Value::as_array) {
        let mut controllers = 0;
        for r in refs {
            let required = [
                ("apiVersion", "version"),
                ("kind", "kind"),
                ("name", "name"),
                ("uid", "uid"),
            ];
            for (field, what) in required {
                if r.get(field)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
                {
                    errs.push(FieldError::invalid(
                        format!("metadata.ownerReferences.{field}"),
                        "",
                        format!("{what} must not be empty"),
                    ));
                }
            }
            if r.get("controller").and_then(Value::as_bool) == Some(true) {
                controllers += 1;
            }
        }
        if controllers > 1 {
            errs.push(FieldError::invalid_raw(
                "metadata.ownerReferences",
                serde_json::to_string(refs).unwrap_or_default(),
                "Only one reference can have Controller set to true",
            ));
        }
    }
    if let Some(fins) = meta.get("finalizers").and_then(Value::as_array) {
        let names: Vec<&str> = fins.iter().filter_map(Value::as_str).collect();
        for f in &names {
            for msg in qualified_name(f) {
                errs.push(FieldError::invalid("metadata.finalizers", f, msg));
            }
        }
        if names.contains(&"orphan") && names.contains(&"foregroundDeletion") {
            errs.push(FieldError::invalid_raw(
                "metadata.finalizers",
                format!("{names:?}").replace(", ", " "),
                "finalizer orphan and foregroundDeletion cannot be both set",
            ));
        }
    }
}

/// The checks of ValidateObjectMetaUpdate that matter here.
pub fn validate_meta_update(new: &Value, old: &Value, errs: &mut Vec<FieldError>) {
    let deleting = at(old, &["metadata", "deletionTimestamp"]).is_some_and(|v| !v.is_null());
    if deleting {
        let old_f = super::util::finalizers(old);
        let added: Vec<String> = super::util::finalizers(new)
            .into_iter()
            .filter(|f| !old_f.contains(f))
            .collect();
        if !added.is_empty() {
            errs.push(FieldError::forbidden(
                "metadata.finalizers",
                format!("no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}", added.iter().map(|f| quote(f)).collect::<Vec<_>>().join(", ")),
            ));
        }
    }
}

fn digits(s: &str, n: usize) -> Option<(u32, &str)> {
    if s.len() < n || !s.as_bytes()[..n].iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some((s[..n].parse().ok()?, &s[n..]))
}

/// Parses a metav1.MicroTime the way Go does with layout `2006-01-02T15:04:05.000000Z07:00`,
/// returning Go's error text.
pub fn parse_micro_time(value: &str) -> Result<(), String> {
    const LAYOUT: &str = "2006-01-02T15:04:05.000000Z07:00";
    let bad = |rest: &str, elem: &str| {
        format!(
            "parsing time {} as {}: cannot parse {} as {}",
            quote(value),
            quote(LAYOUT),
            quote(rest),
            quote(elem)
        )
    };
    let range = |what: &str| format!("parsing time {}: {what} out of range", quote(value));
    let mut rest = value;
    let mut nums = Vec::new();
    for (elem, width, sep) in [
        ("2006", 4, "-"),
        ("01", 2, "-"),
        ("02", 2, "T"),
        ("15", 2, ":"),
        ("04", 2, ":"),
        ("05", 2, ""),
    ] {
        let (n, r) = digits(rest, width).ok_or_else(|| bad(rest, elem))?;
        nums.push(n);
        rest = r;
        if !sep.is_empty() {
            rest = rest.strip_prefix(sep).ok_or_else(|| bad(rest, sep))?;
        }
    }
    if rest.len() < 7
        || !rest.starts_with(['.', ','])
        || !rest.as_bytes()[1..7].iter().all(u8::is_ascii_digit)
    {
        return Err(bad(rest, ".000000"));
    }
    rest = &rest[7..];
    if let Some(r) = rest.strip_prefix('Z') {
        rest = r;
    } else {
        let ok = rest.len() >= 6
            && rest.starts_with(['+', '-'])
            && digits(&rest[1..], 2).is_some()
            && rest.as_bytes()[3] == b':'
            && digits(&rest[4..], 2).is_some();
        if !ok {
            return Err(bad(rest, "Z07:00"));
        }
        rest = &rest[6..];
    }
    if !rest.is_empty() {
        return Err(format!(
            "parsing time {}: extra text: {}",
            quote(value),
            quote(rest)
        ));
    }
    if !(1..=12).contains(&nums[1]) {
        return Err(range("month"));
    }
    if !(1..=31).contains(&nums[2]) {
        return Err(range("day"));
    }
    if nums[3] > 23 {
        return Err(range("hour"));
    }
    if nums[4] > 59 {
        return Err(range("minute"));
    }
    if nums[5] > 59 {
        return Err(range("second"));
    }
    Ok(())
}

/// The MicroTime fields of a kind, as paths from the object root.
pub fn micro_time_fields(group: &str, kind: &str) -> &'static [&'static [&'static str]] {
    match (group, kind) {
        ("coordination.k8s.io", "Lease") => &[&["spec", "renewTime"], &["spec", "acquireTime"]],
        ("events.k8s.io", "Event") | ("", "Event") => {
            &[&["eventTime"], &["series", "lastObservedTime"]]
        }
        _ => &[],
    }
}

fn config_key_errors(field: &str, map: Option<&Value>, errs: &mut Vec<FieldError>) -> usize {
    let mut size = 0;
    for (k, v) in map.and_then(Value::as_object).into_iter().flatten() {
        let f = format!("{field}[{k}]");
        let valid = !k.is_empty()
            && k.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.');
        if !valid {
            errs.push(FieldError::invalid(
                &f,
                k,
                regex_error(
                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                    "[-._a-zA-Z0-9]+",
                    &["key.name", "KEY_NAME", "key-name"],
                ),
            ));
        }
        if k.len() > 253 {
            errs.push(FieldError::invalid(&f, k, max_len(253)));
        }
        if k == "." || k == ".." {
            errs.push(FieldError::invalid(&f, k, format!("must not be '{k}'")));
        } else if k.starts_with("..") {
            errs.push(FieldError::invalid(&f, k, "must not start with '..'"));
        }
        size += v.as_str().map(str::len).unwrap_or(0);
    }
    size
}

fn go_string_map(v: Option<&Value>) -> String {
    let items: Vec<String> = string_map(v)
        .iter()
        .map(|(k, v)| format!("{}:{}", quote(k), quote(v)))
        .collect();
    format!("map[string]string{{{}}}", items.join(", "))
}

/// PodSpec checks for a pod or a pod template at `base` (e.g. `spec.template.spec`).
fn validate_pod_spec(spec: Option<&Value>, base: &str, errs: &mut Vec<FieldError>) {
    let containers = spec
        .and_then(|s| s.get("containers"))
        .and_then(Value::as_array);
    let Some(containers) = containers.filter(|c| !c.is_empty()) else {
        errs.push(FieldError::required(format!("{base}.containers"), ""));
        return;
    };
    let mut seen: Vec<&str> = Vec::new();
    for (i, c) in containers.iter().enumerate() {
        let name = c.get("name").and_then(Value::as_str).unwrap_or("");
        let f = format!("{base}.containers[{i}]");
        if name.is_empty() {
            errs.push(FieldError::required(format!("{f}.name"), ""));
        } else {
            for msg in dns1123_label(name) {
                errs.push(FieldError::invalid(format!("{f}.name"), name, msg));
            }
            if seen.contains(&name) {
                errs.push(FieldError {
                    kind: super::errors::FieldErrorKind::Duplicate(quote(name)),
                    field: format!("{f}.name"),
                    detail: String::new(),
                });
            }
            seen.push(name);
        }
        if c.get("image")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            errs.push(FieldError::required(format!("{f}.image"), ""));
        }
        for (j, p) in c
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let port = p.get("containerPort").and_then(Value::as_i64).unwrap_or(0);
            if !(1..=65535).contains(&port) {
                errs.push(FieldError::invalid_raw(
                    format!("{f}.ports[{j}].containerPort"),
                    port.to_string(),
                    "must be between 1 and 65535, inclusive",
                ));
            }
        }
    }
}

/// How Go's `%#v` prints a metav1.LabelSelector.
fn go_label_selector(sel: &Value) -> String {
    let labels = match sel.get("matchLabels") {
        None | Some(Value::Null) => "map[string]string(nil)".to_string(),
        l => go_string_map(l),
    };
    let exprs = match sel.get("matchExpressions").and_then(Value::as_array) {
        None => "[]v1.LabelSelectorRequirement(nil)".to_string(),
        Some(list) => {
            let items: Vec<String> = list
                .iter()
                .map(|e| {
                    let s = |k: &str| quote(e.get(k).and_then(Value::as_str).unwrap_or(""));
                    let values: Vec<String> = e
                        .get("values")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().map(|v| quote(v.as_str().unwrap_or(""))).collect())
                        .unwrap_or_default();
                    format!(
                        "v1.LabelSelectorRequirement{{Key:{}, Operator:{}, Values:[]string{{{}}}}}",
                        s("key"),
                        s("operator"),
                        values.join(", ")
                    )
                })
                .collect();
            format!("[]v1.LabelSelectorRequirement{{{}}}", items.join(", "))
        }
    };
    format!("v1.LabelSelector{{MatchLabels:{labels}, MatchExpressions:{exprs}}}")
}

/// ValidateDeploymentSpec and its siblings: a selector that selects the template's labels.
fn validate_selector_and_template(obj: &Value, kind_word: &str, errs: &mut Vec<FieldError>) {
    let selector = at(obj, &["spec", "selector"]).filter(|s| !s.is_null());
    let labels = at(obj, &["spec", "template", "metadata", "labels"]).filter(|l| !l.is_null());
    let label_pairs: Vec<(String, String)> = string_map(labels)
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    let mismatch = |errs: &mut Vec<FieldError>| {
        let shown = if labels.is_some() {
            go_string_map(labels)
        } else {
            "map[string]string(nil)".to_string()
        };
        errs.push(FieldError::invalid_raw(
            "spec.template.metadata.labels",
            shown,
            "`selector` does not match template `labels`",
        ));
    };
    match selector {
        None => {
            errs.push(FieldError::required("spec.selector", ""));
            // A nil selector selects nothing.
            mismatch(errs);
        }
        Some(sel) => match LabelSelector::from_json(sel) {
            Err(e) => errs.push(FieldError::invalid_raw(
                "spec.selector",
                go_label_selector(sel),
                e,
            )),
            Ok(ls) if ls.is_empty() => errs.push(FieldError::invalid_raw(
                "spec.selector",
                go_label_selector(sel),
                format!("empty selector is invalid for {kind_word}"),
            )),
            Ok(ls) => {
                if !ls.matches(&label_pairs) {
                    mismatch(errs);
                }
            }
        },
    }
    if let Some(labels) = labels {
        validate_labels(Some(labels), "spec.template.metadata.labels", errs);
    }
}

fn non_negative(obj: &Value, path: &[&str], errs: &mut Vec<FieldError>) {
    if let Some(n) = at(obj, path).and_then(Value::as_i64)
        && n < 0
    {
        errs.push(FieldError::invalid_raw(
            path.join("."),
            n.to_string(),
            "must be greater than or equal to 0",
        ));
    }
}

fn restart_policy(obj: &Value, path: &[&str], allowed: &[&str], errs: &mut Vec<FieldError>) {
    if at(obj, &path[..path.len() - 1]).is_none() {
        // No pod spec at all: the containers error says it.
        return;
    }
    let value = at(obj, path).and_then(Value::as_str).unwrap_or("");
    if !allowed.contains(&value) {
        errs.push(FieldError::not_supported(path.join("."), value, allowed));
    }
}

/// Kind specific checks of a new object (and, on update, against the old one).
pub fn validate_kind(
    rt: &ResourceType,
    obj: &Value,
    old: Option<&Value>,
    errs: &mut Vec<FieldError>,
) {
    if rt.is_custom() {
        return;
    }
    let spec_changed = |path: &[&str]| old.is_some_and(|o| at(o, path) != at(obj, path));
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("", "ConfigMap") => {
            let size = config_key_errors("data", obj.get("data"), errs)
                + config_key_errors("binaryData", obj.get("binaryData"), errs);
            if size > 1024 * 1024 {
                errs.push(FieldError::too_long("", "must have at most 1048576 bytes"));
            }
            immutable_data(obj, old, errs);
        }
        ("", "Secret") => {
            // `data` holds base64: what counts against the limit is the bytes it decodes to.
            let encoded = config_key_errors("data", obj.get("data"), errs);
            if encoded / 4 * 3 > 1024 * 1024 {
                errs.push(FieldError::too_long(
                    "data",
                    "must have at most 1048576 bytes",
                ));
            }
            immutable_data(obj, old, errs);
            if let Some(old) = old
                && old.get("type") != obj.get("type")
            {
                errs.push(FieldError::invalid(
                    "type",
                    str_at(obj, &["type"]).unwrap_or(""),
                    "field is immutable",
                ));
            }
        }
        ("", "Pod") => validate_pod_spec(obj.get("spec"), "spec", errs),
        ("", "Service") => {
            let type_ = str_at(obj, &["spec", "type"]).unwrap_or("ClusterIP");
            let headless = str_at(obj, &["spec", "clusterIP"]) == Some("None");
            let ports = at(obj, &["spec", "ports"]).and_then(Value::as_array);
            if type_ != "ExternalName" && !headless && ports.is_none_or(|p| p.is_empty()) {
                errs.push(FieldError::required("spec.ports", ""));
            }
            let require_name = ports.is_some_and(|p| p.len() > 1);
            let mut names: Vec<&str> = Vec::new();
            for (i, p) in ports.into_iter().flatten().enumerate() {
                let name = p.get("name").and_then(Value::as_str).unwrap_or("");
                let field = format!("spec.ports[{i}].name");
                if require_name && name.is_empty() {
                    errs.push(FieldError::required(&field, ""));
                } else if !name.is_empty() {
                    for msg in dns1123_label(name) {
                        errs.push(FieldError::invalid(&field, name, msg));
                    }
                    if names.contains(&name) {
                        errs.push(FieldError {
                            kind: super::errors::FieldErrorKind::Duplicate(quote(name)),
                            field: field.clone(),
                            detail: String::new(),
                        });
                    }
                    names.push(name);
                }
                let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
                if !(1..=65535).contains(&port) {
                    errs.push(FieldError::invalid_raw(
                        format!("spec.ports[{i}].port"),
                        port.to_string(),
                        "must be between 1 and 65535, inclusive",
                    ));
                }
            }
            if let Some(old) = old {
                let old_ip = str_at(old, &["spec", "clusterIP"]).unwrap_or("");
                let new_ip = str_at(obj, &["spec", "clusterIP"]).unwrap_or("");
                if !old_ip.is_empty() && old_ip != new_ip && type_ != "ExternalName" {
                    errs.push(FieldError::invalid(
                        "spec.clusterIPs[0]",
                        new_ip,
                        "may not change once set",
                    ));
                }
            }
        }
        ("apps", "Deployment" | "ReplicaSet" | "DaemonSet" | "StatefulSet") => {
            let word = rt.kind.to_lowercase();
            validate_selector_and_template(obj, &word, errs);
            validate_pod_spec(
                at(obj, &["spec", "template", "spec"]),
                "spec.template.spec",
                errs,
            );
            restart_policy(
                obj,
                &["spec", "template", "spec", "restartPolicy"],
                &["Always"],
                errs,
            );
            non_negative(obj, &["spec", "replicas"], errs);
            if rt.kind == "Deployment"
                && str_at(obj, &["spec", "strategy", "type"]) == Some("Recreate")
                && at(obj, &["spec", "strategy", "rollingUpdate"]).is_some_and(|r| !r.is_null())
            {
                errs.push(FieldError::forbidden(
                    "spec.strategy.rollingUpdate",
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
            if spec_changed(&["spec", "selector"]) {
                errs.push(FieldError::invalid_raw(
                    "spec.selector",
                    go_label_selector(at(obj, &["spec", "selector"]).unwrap_or(&Value::Null)),
                    "field is immutable",
                ));
            }
            if rt.kind == "StatefulSet"
                && let Some(old) = old
            {
                let strip = |v: &Value| {
                    let mut s = v.get("spec").cloned().unwrap_or(Value::Null);
                    if let Value::Object(m) = &mut s {
                        for k in [
                            "replicas",
                            "ordinals",
                            "template",
                            "updateStrategy",
                            "persistentVolumeClaimRetentionPolicy",
                            "minReadySeconds",
                        ] {
                            m.remove(k);
                        }
                    }
                    s
                };
                if strip(obj) != strip(old) {
                    errs.push(FieldError::forbidden("spec", "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"));
                }
            }
        }
        ("batch", "Job") => {
            validate_pod_spec(
                at(obj, &["spec", "template", "spec"]),
                "spec.template.spec",
                errs,
            );
            restart_policy(
                obj,
                &["spec", "template", "spec", "restartPolicy"],
                &["OnFailure", "Never"],
                errs,
            );
            non_negative(obj, &["spec", "parallelism"], errs);
            non_negative(obj, &["spec", "completions"], errs);
            non_negative(obj, &["spec", "backoffLimit"], errs);
            if spec_changed(&["spec", "template"]) {
                errs.push(FieldError::invalid_raw(
                    "spec.template",
                    "core.PodTemplateSpec{...}",
                    "field is immutable",
                ));
            }
            if spec_changed(&["spec", "selector"]) {
                errs.push(FieldError::invalid_raw(
                    "spec.selector",
                    "v1.LabelSelector{...}",
                    "field is immutable",
                ));
            }
        }
        ("batch", "CronJob") => {
            if str_at(obj, &["spec", "schedule"]).unwrap_or("").is_empty() {
                errs.push(FieldError::required("spec.schedule", ""));
            }
            validate_pod_spec(
                at(obj, &["spec", "jobTemplate", "spec", "template", "spec"]),
                "spec.jobTemplate.spec.template.spec",
                errs,
            );
            restart_policy(
                obj,
                &[
                    "spec",
                    "jobTemplate",
                    "spec",
                    "template",
                    "spec",
                    "restartPolicy",
                ],
                &["OnFailure", "Never"],
                errs,
            );
        }
        ("networking.k8s.io", "Ingress") => {
            let rules = at(obj, &["spec", "rules"]).and_then(Value::as_array);
            for (i, rule) in rules.into_iter().flatten().enumerate() {
                let paths = at(rule, &["http", "paths"]).and_then(Value::as_array);
                for (j, p) in paths.into_iter().flatten().enumerate() {
                    let base = format!("spec.rules[{i}].http.paths[{j}]");
                    match p.get("pathType").and_then(Value::as_str) {
                        None => errs.push(FieldError::required(
                            format!("{base}.pathType"),
                            "pathType must be specified",
                        )),
                        Some("Exact" | "Prefix") => {
                            let path = p.get("path").and_then(Value::as_str).unwrap_or("");
                            if !path.starts_with('/') {
                                errs.push(FieldError::invalid(
                                    format!("{base}.path"),
                                    path,
                                    "must be an absolute path",
                                ));
                            }
                        }
                        Some("ImplementationSpecific") => {}
                        Some(other) => errs.push(FieldError::not_supported(
                            format!("{base}.pathType"),
                            other,
                            &["Exact", "ImplementationSpecific", "Prefix"],
                        )),
                    }
                }
            }
        }
        ("rbac.authorization.k8s.io", kind @ ("RoleBinding" | "ClusterRoleBinding")) => {
            let role_ref = obj.get("roleRef").cloned().unwrap_or(Value::Null);
            let s = |k: &str| {
                role_ref
                    .get(k)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            let kinds: &[&str] = if kind == "RoleBinding" {
                &["Role", "ClusterRole"]
            } else {
                &["ClusterRole"]
            };
            if s("apiGroup") != "rbac.authorization.k8s.io" {
                errs.push(FieldError::not_supported(
                    "roleRef.apiGroup",
                    &s("apiGroup"),
                    &["rbac.authorization.k8s.io"],
                ));
            }
            if !kinds.contains(&s("kind").as_str()) {
                errs.push(FieldError::not_supported("roleRef.kind", &s("kind"), kinds));
            }
            if s("name").is_empty() {
                errs.push(FieldError::required("roleRef.name", ""));
            }
            for (i, subject) in obj
                .get("subjects")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let f = |k: &str| {
                    subject
                        .get(k)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                if f("name").is_empty() {
                    errs.push(FieldError::required(format!("subjects[{i}].name"), ""));
                }
                match f("kind").as_str() {
                    "ServiceAccount" => {
                        if !f("apiGroup").is_empty() {
                            errs.push(FieldError::not_supported(
                                format!("subjects[{i}].apiGroup"),
                                &f("apiGroup"),
                                &[""],
                            ));
                        }
                        if kind == "ClusterRoleBinding" && f("namespace").is_empty() {
                            errs.push(FieldError::required(format!("subjects[{i}].namespace"), ""));
                        }
                    }
                    "User" | "Group" => {
                        if f("apiGroup") != "rbac.authorization.k8s.io" {
                            errs.push(FieldError::not_supported(
                                format!("subjects[{i}].apiGroup"),
                                &f("apiGroup"),
                                &["rbac.authorization.k8s.io"],
                            ));
                        }
                    }
                    other => errs.push(FieldError::not_supported(
                        format!("subjects[{i}].kind"),
                        other,
                        &["ServiceAccount", "User", "Group"],
                    )),
                }
            }
            if let Some(old) = old
                && old.get("roleRef") != obj.get("roleRef")
            {
                errs.push(FieldError::invalid_raw(
                    "roleRef",
                    format!(
                        "rbac.RoleRef{{APIGroup:{}, Kind:{}, Name:{}}}",
                        quote(&s("apiGroup")),
                        quote(&s("kind")),
                        quote(&s("name"))
                    ),
                    "cannot change roleRef",
                ));
            }
        }
        ("coordination.k8s.io", "Lease") => {
            if let Some(n) = at(obj, &["spec", "leaseDurationSeconds"]).and_then(Value::as_i64)
                && n <= 0
            {
                errs.push(FieldError::invalid_raw(
                    "spec.leaseDurationSeconds",
                    n.to_string(),
                    "must be greater than 0",
                ));
            }
            if let Some(n) = at(obj, &["spec", "leaseTransitions"]).and_then(Value::as_i64)
                && n < 0
            {
                errs.push(FieldError::invalid_raw(
                    "spec.leaseTransitions",
                    n.to_string(),
                    "must be greater than or equal to 0",
                ));
            }
        }
        ("", "Namespace") => {
            if let Some(old) = old
                && old.get("spec") != obj.get("spec")
            {
                // spec.finalizers only changes through /finalize; the strategy keeps the old spec.
            }
        }
        _ => {}
    }
}

fn immutable_data(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let Some(old) = old else { return };
    if old.get("immutable").and_then(Value::as_bool) != Some(true) {
        return;
    }
    if obj.get("data") != old.get("data") {
        errs.push(FieldError::forbidden(
            "data",
            "field is immutable when `immutable` is set",
        ));
    }
    if obj.get("binaryData") != old.get("binaryData") {
        errs.push(FieldError::forbidden(
            "binaryData",
            "field is immutable when `immutable` is set",
        ));
    }
    if obj.get("immutable").and_then(Value::as_bool) != Some(true) {
        errs.push(FieldError::forbidden(
            "immutable",
            "field is immutable when `immutable` is set",
        ));
    }
}

/// Event checks (legacyValidateEvent, and for events.k8s.io/v1 creates the strict part of
/// ValidateEventCreate), on the object in events.k8s.io/v1 form; `core` when it came through
/// the core/v1 API.
pub fn validate_event(ev: &Value, core: bool, create: bool, errs: &mut Vec<FieldError>) {
    let s = |k: &str| ev.get(k).and_then(Value::as_str).unwrap_or("");
    let ns = super::util::meta_str(ev, "namespace").unwrap_or("");
    let regarding_ns = str_at(ev, &["regarding", "namespace"]).unwrap_or("");
    let mismatch = || {
        FieldError::invalid(
            "involvedObject.namespace",
            regarding_ns,
            "does not match event.namespace",
        )
    };
    let has_time = ev.get("eventTime").is_some_and(|t| !t.is_null());
    if core && !has_time {
        // An old style event: only the namespaces have to agree.
        let ok = if regarding_ns.is_empty() {
            ns.is_empty() || ns == "default"
        } else {
            ns == regarding_ns
        };
        if !ok {
            errs.push(mismatch());
        }
        return;
    }
    if regarding_ns.is_empty() {
        if ns != "default" && ns != "kube-system" {
            errs.push(mismatch());
        }
    } else if regarding_ns != ns {
        errs.push(mismatch());
    }
    let controller_field = if core {
        "reportingComponent"
    } else {
        "reportingController"
    };
    if s("reportingController").is_empty() {
        errs.push(FieldError::required(controller_field, ""));
    }
    for msg in qualified_name(s("reportingController")) {
        errs.push(FieldError::invalid(
            controller_field,
            s("reportingController"),
            msg,
        ));
    }
    for field in ["reportingInstance", "action", "reason"] {
        if s(field).is_empty() {
            errs.push(FieldError::required(field, ""));
        }
        if s(field).len() > 128 {
            errs.push(FieldError::invalid(
                field,
                "",
                "can have at most 128 characters",
            ));
        }
    }
    if s("note").len() > 1024 {
        errs.push(FieldError::invalid(
            "note",
            "",
            "can have at most 1024 characters",
        ));
    }
    if create && !core {
        if ev.get("eventTime").is_none_or(Value::is_null) {
            errs.push(FieldError::required("eventTime", ""));
        }
        if s("type") != "Normal" && s("type") != "Warning" {
            errs.push(FieldError::invalid(
                "type",
                "",
                format!("has invalid value: {}", s("type")),
            ));
        }
        for (k, field) in [
            ("deprecatedFirstTimestamp", "firstTimestamp"),
            ("deprecatedLastTimestamp", "lastTimestamp"),
            ("deprecatedCount", "count"),
            ("deprecatedSource", "source"),
        ] {
            if ev.get(k).is_some_and(|v| {
                !v.is_null() && v != &Value::from(0) && v != &serde_json::json!({})
            }) {
                errs.push(FieldError::invalid(field, "", "needs to be unset"));
            }
        }
    }
}

/// The CEL rules (`x-kubernetes-validations`) of a custom resource's schema, evaluated as
/// kube-apiserver does: a failed rule is `Invalid value: "<type>": <message>` at the rule's
/// field, `<nil>` for a rule at the root of the schema (which may read `self.metadata.name`).
pub fn validate_cel(schema: &Value, obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    use kube::core::cel::{CompiledSchema, compile_schema, validate_compiled};
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::rc::Rc;
    thread_local! {
        /// Compiled once per schema (and thread), not at every write.
        static COMPILED: RefCell<HashMap<String, Rc<CompiledSchema>>> = RefCell::new(HashMap::new());
    }
    let key = schema.to_string();
    let compiled = COMPILED.with(|c| {
        Rc::clone(
            c.borrow_mut()
                .entry(key)
                .or_insert_with(|| Rc::new(compile_schema(schema))),
        )
    });
    let Err(failures) = validate_compiled(&compiled, obj, old) else {
        return;
    };
    for failure in failures.into_vec() {
        let path = failure.field_path;
        let at = if path.is_empty() {
            Some(obj)
        } else {
            path.split('.')
                .try_fold(obj, |v, segment| match segment.split_once('[') {
                    Some((key, index)) => v
                        .get(key)?
                        .get(index.trim_end_matches(']').parse::<usize>().ok()?),
                    None => v.get(segment),
                })
        };
        let type_name = match at {
            Some(Value::String(_)) => "string",
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => "integer",
            Some(Value::Number(_)) => "number",
            Some(Value::Bool(_)) => "boolean",
            Some(Value::Array(_)) => "array",
            Some(Value::Null) => "null",
            _ => "object",
        };
        let field = if path.is_empty() {
            "<nil>".to_string()
        } else {
            path
        };
        errs.push(FieldError::invalid(field, type_name, failure.message));
    }
}

/// The OpenAPI value validations of a custom resource's schema (`type`, `required`, `enum`,
/// `pattern`, `minLength`/`maxLength`, `minimum`/`maximum`, `minItems`/`maxItems`,
/// `minProperties`/`maxProperties`, `allOf`/`anyOf`), checked as kube-apiserver's schema
/// validator does before the CEL rules, with its wording (`spec.x in body should match
/// '<pattern>'`, `... should be at least 1 chars long`). `metadata` is validated on its own;
/// nulls of fields that are not `nullable` were pruned before validation; formats are not
/// checked.
pub fn validate_schema(schema: &Value, obj: &Value, errs: &mut Vec<FieldError>) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let Some(object) = obj.as_object() else {
        return;
    };
    for (key, value) in object {
        if key == "metadata" || key == "apiVersion" || key == "kind" {
            continue;
        }
        if let Some(sub) = properties.get(key) {
            check_value(sub, value, key, errs);
        }
    }
    required(schema, object, "", errs);
}

fn required(
    schema: &Value,
    object: &serde_json::Map<String, Value>,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    for name in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !object.contains_key(name) || object[name].is_null() {
            let field = if path.is_empty() {
                name.to_string()
            } else {
                format!("{path}.{name}")
            };
            errs.push(FieldError::required(field, ""));
        }
    }
}

/// How Go prints a JSON value in a field error: strings quoted, the rest as they are.
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => quote(s),
        Value::Object(_) => "\"object\"".to_string(),
        Value::Array(_) => "\"array\"".to_string(),
        other => other.to_string(),
    }
}

fn check_value(schema: &Value, value: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if value.is_null() {
        return;
    }
    let number = |key: &str| schema.get(key).and_then(Value::as_f64);
    let count = |key: &str| schema.get(key).and_then(Value::as_u64);
    let int_or_string = schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true);
    if let Some(kind) = schema.get("type").and_then(Value::as_str) {
        let fits = match kind {
            "string" => value.is_string(),
            "integer" => value.as_i64().is_some() || value.as_u64().is_some(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            "object" => value.is_object(),
            "array" => value.is_array(),
            _ => true,
        };
        if !fits {
            let got = match value {
                Value::String(_) => "string",
                Value::Number(_) => "number",
                Value::Bool(_) => "boolean",
                Value::Array(_) => "array",
                _ => "object",
            };
            errs.push(FieldError::invalid_raw(
                path,
                shown(value),
                format!("{path} in body must be of type {kind}: \"{got}\""),
            ));
            return;
        }
    } else if int_or_string && !(value.is_string() || value.is_i64() || value.is_u64()) {
        errs.push(FieldError::invalid_raw(
            path,
            shown(value),
            format!("{path} in body must be of type integer,string"),
        ));
        return;
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        let supported: Vec<String> = options.iter().map(shown).collect();
        errs.push(FieldError {
            kind: super::errors::FieldErrorKind::NotSupported(shown(value)),
            field: path.to_string(),
            detail: format!("supported values: {}", supported.join(", ")),
        });
    }
    match value {
        Value::String(text) => {
            let chars = text.chars().count() as u64;
            if let Some(min) = count("minLength")
                && chars < min
            {
                errs.push(FieldError::invalid(
                    path,
                    text,
                    format!("{path} in body should be at least {min} chars long"),
                ));
            }
            if let Some(max) = count("maxLength")
                && chars > max
            {
                errs.push(FieldError::too_long(
                    path,
                    format!("may not be more than {max} bytes"),
                ));
            }
            if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
                && regex::Regex::new(pattern).is_ok_and(|re| !re.is_match(text))
            {
                errs.push(FieldError::invalid(
                    path,
                    text,
                    format!("{path} in body should match '{pattern}'"),
                ));
            }
        }
        Value::Number(n) => {
            let v = n.as_f64().unwrap_or(0.0);
            if let Some(min) = number("minimum")
                && (v < min
                    || (v == min && schema.get("exclusiveMinimum") == Some(&Value::Bool(true))))
            {
                errs.push(FieldError::invalid_raw(
                    path,
                    n.to_string(),
                    format!("{path} in body should be greater than or equal to {min}"),
                ));
            }
            if let Some(max) = number("maximum")
                && (v > max
                    || (v == max && schema.get("exclusiveMaximum") == Some(&Value::Bool(true))))
            {
                errs.push(FieldError::invalid_raw(
                    path,
                    n.to_string(),
                    format!("{path} in body should be less than or equal to {max}"),
                ));
            }
        }
        Value::Array(items) => {
            if let Some(min) = count("minItems")
                && (items.len() as u64) < min
            {
                errs.push(FieldError::invalid_raw(
                    path,
                    "\"array\"",
                    format!("{path} in body should have at least {min} items"),
                ));
            }
            if let Some(max) = count("maxItems")
                && (items.len() as u64) > max
            {
                errs.push(FieldError::invalid_raw(
                    path,
                    "\"array\"",
                    format!("{path} in body should have at most {max} items"),
                ));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check_value(item_schema, item, &format!("{path}[{i}]"), errs);
                }
            }
        }
        Value::Object(map) => {
            if let Some(min) = count("minProperties")
                && (map.len() as u64) < min
            {
                errs.push(FieldError::invalid_raw(
                    path,
                    "\"object\"",
                    format!("{path} in body should have at least {min} properties"),
                ));
            }
            if let Some(max) = count("maxProperties")
                && (map.len() as u64) > max
            {
                errs.push(FieldError::invalid_raw(
                    path,
                    "\"object\"",
                    format!("{path} in body should have at most {max} properties"),
                ));
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, item) in map {
                let sub = properties.and_then(|p| p.get(key)).or(additional);
                if let Some(sub) = sub {
                    check_value(sub, item, &format!("{path}.{key}"), errs);
                }
            }
            required(schema, map, path, errs);
        }
        _ => {}
    }
    for sub in schema
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        check_value(sub, value, path, errs);
    }
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array)
        && !any.iter().any(|sub| {
            let mut scratch = Vec::new();
            check_value(sub, value, path, &mut scratch);
            scratch.is_empty()
        })
    {
        errs.push(FieldError::invalid_raw(
            path,
            shown(value),
            format!("{path} in body must match at least one schema in anyOf"),
        ));
    }
}
