//! What `sequenced diff` found, and how it is shown (pure): the comparison of a live object
//! with its server-side apply dry run restricted to the fields manager `sequenced` owns, Secret
//! values masked, the layers whose order changed, and the text and JSON drawings.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::api::FIELD_MANAGER;
use crate::plan::Plan;

/// What a revision would do to one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// It does not exist: it would be created.
    Create,
    /// Fields sequenced manages would change.
    Change,
    /// The apply would change none of the fields sequenced manages.
    Unchanged,
    /// It would be deleted (a prune).
    Delete,
    /// A hook that would run.
    Run,
}

impl Action {
    fn marker(self) -> &'static str {
        match self {
            Action::Create => "+",
            Action::Change => "~",
            Action::Unchanged => "=",
            Action::Delete => "-",
            Action::Run => ">",
        }
    }

    fn colour(self) -> &'static str {
        match self {
            Action::Create => GREEN,
            Action::Change => YELLOW,
            Action::Unchanged => "",
            Action::Delete => RED,
            Action::Run => CYAN,
        }
    }
}

/// One object of a stage or layer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectDiff {
    pub action: Action,
    pub api_version: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// The chart path and template it comes from (not known of an object to prune).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chart: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// A hook's `helm.sh/hook-weight`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<i64>,
    /// A unified diff (`--- live`, `+++ applied`) of the fields sequenced manages; for an object
    /// to create, the whole object as it would be applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

impl ObjectDiff {
    fn label(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

/// A layer of a stage: a layer of the plan, or the stage itself (`(crds)`, `(pre-upgrade)`,
/// `(prune)`), as `status.layers` names them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerDiff {
    pub chart: String,
    pub name: String,
    pub objects: Vec<ObjectDiff>,
}

/// One stage of the revision, in rollout order: `crds`, the pre hooks, `layers`, `prune`, the
/// post hooks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageDiff {
    pub stage: String,
    /// What the stage says beyond its objects (the CRD policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub layers: Vec<LayerDiff>,
}

/// Where a layer sits in a plan: its level (1 starts at once) and the layers and charts it
/// waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Position {
    pub level: usize,
    pub after: Vec<String>,
}

/// A layer of both plans whose place in the order changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Moved {
    pub chart: String,
    pub name: String,
    pub before: Position,
    pub after: Position,
}

/// How many objects each action concerns.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub create: usize,
    pub change: usize,
    pub delete: usize,
    pub unchanged: usize,
    pub hooks: usize,
}

/// Everything `sequenced diff` found.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// `namespace/name` of the SequencedRelease.
    pub release: String,
    /// `install`, `upgrade` or `rollback`.
    pub operation: String,
    /// The live revision (none before the first install).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_revision: Option<i64>,
    /// For a rollback, the revision whose stored plan is applied again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollback_to: Option<i64>,
    /// Whether the operator would begin a new revision (which runs the hooks): the chart or
    /// values changed, or it is an install or a rollback.
    pub new_revision: bool,
    /// Why a new revision would start (`spec.values changed`, `the chart changed (web 0.1.0 ->
    /// 0.2.0)`, `a rollback to revision 2`); absent when none would.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_revision_reason: Option<String>,
    /// Whether anything would change: a new revision, or an object created, changed or deleted.
    pub changes: bool,
    pub stages: Vec<StageDiff>,
    pub layer_order: Vec<Moved>,
    pub summary: Summary,
}

impl Report {
    /// Counts the actions and decides `changes`.
    pub fn finish(mut self) -> Report {
        let mut summary = Summary::default();
        for object in self
            .stages
            .iter()
            .flat_map(|s| s.layers.iter())
            .flat_map(|l| l.objects.iter())
        {
            match object.action {
                Action::Create => summary.create += 1,
                Action::Change => summary.change += 1,
                Action::Unchanged => summary.unchanged += 1,
                Action::Delete => summary.delete += 1,
                Action::Run => summary.hooks += 1,
            }
        }
        self.changes = self.new_revision
            || summary.create + summary.change + summary.delete > 0
            || !self.layer_order.is_empty();
        self.summary = summary;
        self
    }
}

/// The fields manager `sequenced` owns by server-side apply (its `Apply` entries of
/// `metadata.managedFields` outside subresources), as one fieldsV1 tree.
pub fn owned_fields(object: &Value) -> Map<String, Value> {
    let mut fields = Map::new();
    let entries = object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array);
    for entry in entries.into_iter().flatten() {
        let ours = entry.get("manager").and_then(Value::as_str) == Some(FIELD_MANAGER)
            && entry.get("operation").and_then(Value::as_str) == Some("Apply")
            && entry
                .get("subresource")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty);
        if let (true, Some(Value::Object(set))) = (ours, entry.get("fieldsV1")) {
            merge_fields(&mut fields, set);
        }
    }
    fields
}

/// Adds the fieldsV1 tree `more` to `into`.
pub fn merge_fields(into: &mut Map<String, Value>, more: &Map<String, Value>) {
    for (key, value) in more {
        let entry = into
            .entry(key.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if let (Value::Object(inner), Value::Object(more)) = (entry, value) {
            merge_fields(inner, more);
        }
    }
}

/// The part of `value` that the fieldsV1 tree `fields` names: map fields (`f:`), list items by
/// key (`k:`), by value (`v:`) or by index (`i:`); a field with nothing below it whole.
pub fn project(value: &Value, fields: &Map<String, Value>) -> Value {
    if fields.keys().all(|k| k == ".") {
        return value.clone();
    }
    let below = |v: &Value| v.as_object().cloned().unwrap_or_default();
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, sub) in fields {
                let Some(name) = key.strip_prefix("f:") else {
                    continue;
                };
                if let Some(v) = map.get(name) {
                    out.insert(name.to_string(), project(v, &below(sub)));
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            let mut picked: Vec<(usize, Value)> = Vec::new();
            for (key, sub) in fields {
                if let Some(json) = key.strip_prefix("k:") {
                    let Ok(Value::Object(want)) = serde_json::from_str::<Value>(json) else {
                        continue;
                    };
                    for (i, item) in items.iter().enumerate() {
                        if want.iter().all(|(f, v)| item.get(f) == Some(v)) {
                            picked.push((i, project(item, &below(sub))));
                        }
                    }
                } else if let Some(json) = key.strip_prefix("v:") {
                    let Ok(want) = serde_json::from_str::<Value>(json) else {
                        continue;
                    };
                    for (i, item) in items.iter().enumerate() {
                        if *item == want {
                            picked.push((i, item.clone()));
                        }
                    }
                } else if let Some(index) = key.strip_prefix("i:")
                    && let Ok(i) = index.parse::<usize>()
                    && let Some(item) = items.get(i)
                {
                    picked.push((i, project(item, &below(sub))));
                }
            }
            picked.sort_by_key(|(i, _)| *i);
            picked.dedup_by_key(|(i, _)| *i);
            Value::Array(picked.into_iter().map(|(_, v)| v).collect())
        }
        other => other.clone(),
    }
}

fn is_secret(api_version: &str, kind: &str) -> bool {
    api_version == "v1" && kind == "Secret"
}

/// The value a Secret's data is shown as.
const SENSITIVE: &str = "(sensitive value)";

/// Replaces the values of a Secret's `data` and `stringData` on both sides by placeholders that
/// say whether each changed, never the value.
fn mask_secret(live: &mut Value, applied: &mut Value) {
    for field in ["data", "stringData"] {
        let before = live.get(field).and_then(Value::as_object).cloned();
        let after = applied.get(field).and_then(Value::as_object).cloned();
        let (before, after) = (before.unwrap_or_default(), after.unwrap_or_default());
        let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
        let mut masked_before = Map::new();
        let mut masked_after = Map::new();
        for key in keys {
            let (b, a) = (before.get(key), after.get(key));
            let (b, a) = match (b, a) {
                (Some(x), Some(y)) if x == y => (
                    Some("(sensitive value, unchanged)"),
                    Some("(sensitive value, unchanged)"),
                ),
                (Some(_), Some(_)) => (Some(SENSITIVE), Some("(sensitive value, changed)")),
                (Some(_), None) => (Some(SENSITIVE), None),
                (None, Some(_)) => (None, Some("(sensitive value, added)")),
                (None, None) => (None, None),
            };
            if let Some(b) = b {
                masked_before.insert(key.clone(), Value::from(b));
            }
            if let Some(a) = a {
                masked_after.insert(key.clone(), Value::from(a));
            }
        }
        for (side, masked) in [(&mut *live, masked_before), (&mut *applied, masked_after)] {
            if let Some(map) = side.as_object_mut()
                && map.contains_key(field)
            {
                map.insert(field.to_string(), Value::Object(masked));
            }
        }
    }
}

/// For a Secret, the `data` keys the applied object sets, in `data` or `stringData` (the API
/// server keeps both in `data`, and its managed fields need not say so).
fn secret_data_fields(fields: &mut Map<String, Value>, sent: &Value) {
    let keys: Vec<String> = ["data", "stringData"]
        .iter()
        .filter_map(|f| sent.get(*f).and_then(Value::as_object))
        .flat_map(|m| m.keys().cloned())
        .collect();
    if keys.is_empty() {
        return;
    }
    let data = fields
        .entry("f:data")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(data) = data {
        for key in keys {
            data.entry(format!("f:{key}"))
                .or_insert_with(|| Value::Object(Map::new()));
        }
    }
}

fn yaml(value: &Value) -> String {
    match value {
        Value::Object(map) if map.is_empty() => String::new(),
        _ => serde_yaml_ng::to_string(value).unwrap_or_else(|e| format!("# {e}\n")),
    }
}

fn unified(before: &str, after: &str) -> String {
    similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header("live", "applied")
        .to_string()
}

/// How applying `sent` would change a live object, from its server-side apply dry run
/// `applied`: None when no field sequenced manages (on either side) changes, else their unified
/// diff.
pub fn changed(
    api_version: &str,
    kind: &str,
    sent: &Value,
    live: &Value,
    applied: &Value,
) -> Option<String> {
    let mut fields = owned_fields(live);
    merge_fields(&mut fields, &owned_fields(applied));
    if is_secret(api_version, kind) {
        secret_data_fields(&mut fields, sent);
    }
    let (mut before, mut after) = (project(live, &fields), project(applied, &fields));
    if before == after {
        return None;
    }
    if is_secret(api_version, kind) {
        mask_secret(&mut before, &mut after);
    }
    Some(unified(&yaml(&before), &yaml(&after)))
}

/// An object to create, as it would be applied (a Secret's values masked), as a diff from
/// nothing.
pub fn created(api_version: &str, kind: &str, object: &Value) -> String {
    let mut object = object.clone();
    if is_secret(api_version, kind) {
        mask_secret(&mut Value::Null, &mut object);
    }
    unified("", &yaml(&object))
}

/// The layers of both plans (matched by chart and name) whose level or dependencies changed.
pub fn layer_order(before: &Plan, after: &Plan) -> Vec<Moved> {
    let position = |plan: &Plan, layer: &crate::plan::Layer| Position {
        level: layer.level,
        after: layer
            .depends_on
            .iter()
            .filter_map(|d| plan.layers.get(d.layer).map(|l| l.name.clone()))
            .chain(layer.after_charts.iter().map(|c| format!("chart {c}")))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
    };
    after
        .layers
        .iter()
        .filter_map(|new| {
            let old = before
                .layers
                .iter()
                .find(|l| l.chart == new.chart && l.name == new.name)?;
            let (was, is) = (position(before, old), position(after, new));
            (was != is).then(|| Moved {
                chart: new.chart.clone(),
                name: new.name.clone(),
                before: was,
                after: is,
            })
        })
        .collect()
}

const GREEN: &str = "\x1b[32m";
const YELLOW: &str = "\x1b[33m";
const RED: &str = "\x1b[31m";
const CYAN: &str = "\x1b[36m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[0m";

fn paint(text: &str, colour: &str, on: bool) -> String {
    if on && !colour.is_empty() {
        format!("{colour}{text}{RESET}")
    } else {
        text.to_string()
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "nothing".to_string()
    } else {
        names.join(", ")
    }
}

/// The report for people: stage by stage, layer by layer, each object with its marker (`+`
/// create, `~` change, `-` delete, `>` hook that runs) and its diff; colour only when `colour`.
pub fn format_text(report: &Report, colour: bool) -> String {
    let mut out = String::new();
    let revision = match (report.from_revision, report.rollback_to) {
        (Some(from), Some(to)) => format!(" from revision {from} back to revision {to}"),
        (Some(from), None) => format!(" from revision {from}"),
        (None, _) => String::new(),
    };
    out.push_str(&paint(
        &format!(
            "SequencedRelease {}: {}{revision}",
            report.release, report.operation
        ),
        BOLD,
        colour,
    ));
    out.push('\n');
    if !report.changes {
        out.push_str("No changes.\n");
        return out;
    }
    if !report.new_revision {
        out.push_str(
            "The chart and values are those of the live revision: no new revision, no hooks; \
             the operator corrects the fields below as drift.\n",
        );
    }
    for stage in &report.stages {
        let objects: usize = stage.layers.iter().map(|l| l.objects.len()).sum();
        if objects == 0 && stage.note.is_none() {
            continue;
        }
        out.push('\n');
        for layer in &stage.layers {
            let title = if layer.name.starts_with('(') {
                format!("{} {}", layer.name, layer.chart)
            } else {
                format!("layer {} {}", layer.chart, layer.name)
            };
            out.push_str(&paint(&title, BOLD, colour));
            if let Some(note) = &stage.note {
                out.push_str(&format!(" ({note})"));
            }
            out.push('\n');
            let mut unchanged = 0;
            for object in &layer.objects {
                if object.action == Action::Unchanged {
                    unchanged += 1;
                    continue;
                }
                let mut line = format!("  {} {}", object.action.marker(), object.label());
                if let Some(weight) = object.weight {
                    line.push_str(&format!(" (weight {weight})"));
                }
                out.push_str(&paint(&line, object.action.colour(), colour));
                out.push('\n');
                if let Some(diff) = &object.diff {
                    for text in diff.lines() {
                        let painted = match text.as_bytes().first() {
                            _ if text.starts_with("+++") || text.starts_with("---") => {
                                paint(text, BOLD, colour)
                            }
                            Some(b'+') => paint(text, GREEN, colour),
                            Some(b'-') => paint(text, RED, colour),
                            Some(b'@') => paint(text, CYAN, colour),
                            _ => text.to_string(),
                        };
                        out.push_str("      ");
                        out.push_str(&painted);
                        out.push('\n');
                    }
                }
            }
            if unchanged > 0 {
                out.push_str(&format!("  = {unchanged} unchanged\n"));
            }
        }
    }
    if !report.layer_order.is_empty() {
        out.push('\n');
        out.push_str(&paint("Layers whose order changed:", BOLD, colour));
        out.push('\n');
        for moved in &report.layer_order {
            out.push_str(&format!(
                "  ~ layer {} {}: level {} -> {}, after {} -> {}\n",
                moved.chart,
                moved.name,
                moved.before.level,
                moved.after.level,
                list(&moved.before.after),
                list(&moved.after.after),
            ));
        }
    }
    let s = &report.summary;
    out.push_str(&format!(
        "\n{} to create, {} to change, {} to delete, {} unchanged, {} hooks to run.\n",
        s.create, s.change, s.delete, s.unchanged, s.hooks
    ));
    // An upgrade: say why it is a new revision (an install or a rollback says so at the top),
    // above all when no object would change and only the revision makes the exit code 2.
    if report.new_revision && report.from_revision.is_some() && report.rollback_to.is_none() {
        let why = report
            .new_revision_reason
            .as_deref()
            .unwrap_or("the chart or values changed");
        let objects = s.create + s.change + s.delete > 0 || !report.layer_order.is_empty();
        let line = match (objects, s.hooks) {
            (true, _) => format!("A new revision would start: {why}."),
            (false, 0) => {
                format!("A new revision would start: {why}; nothing in the cluster would change.")
            }
            (false, hooks) => format!(
                "A new revision would start: {why}; no object would change, but its {hooks} {} would run.",
                if hooks == 1 { "hook" } else { "hooks" }
            ),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The report for programs: the [`Report`] as JSON.
pub fn format_json(report: &Report) -> String {
    let mut text = serde_json::to_string_pretty(report).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn managed(fields: Value) -> Value {
        json!([{"manager": "sequenced", "operation": "Apply", "fieldsV1": fields},
               {"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {"f:paused": {}}}}])
    }

    #[test]
    fn only_the_fields_sequenced_owns_are_compared() {
        let fields = json!({"f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
            "k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}});
        let live = json!({
            "metadata": {"managedFields": managed(fields.clone()), "resourceVersion": "7"},
            "spec": {"replicas": 1, "paused": true, "template": {"spec": {"containers": [
                {"name": "sidecar", "image": "s:1"}, {"name": "app", "image": "app:1", "imagePullPolicy": "Always"}]}}},
        });
        let mut applied = live.clone();
        applied["metadata"]["resourceVersion"] = json!("8");
        applied["spec"]["paused"] = json!(false);
        applied["spec"]["template"]["spec"]["containers"][0]["image"] = json!("s:2");
        assert_eq!(
            changed("apps/v1", "Deployment", &Value::Null, &live, &applied),
            None
        );
        applied["spec"]["template"]["spec"]["containers"][1]["image"] = json!("app:2");
        let diff = changed("apps/v1", "Deployment", &Value::Null, &live, &applied).unwrap();
        assert!(
            diff.contains("-      - image: app:1\n+      - image: app:2\n         name: app\n"),
            "{diff}"
        );
        assert!(!diff.contains("s:1"), "{diff}");
        assert!(!diff.contains("imagePullPolicy"), "{diff}");
        assert!(diff.starts_with("--- live\n+++ applied\n"), "{diff}");
    }

    #[test]
    fn a_field_sequenced_stops_applying_shows_as_removed() {
        let live = json!({"metadata": {"managedFields": managed(json!({"f:data": {"f:a": {}, "f:b": {}}}))},
                          "data": {"a": "1", "b": "2"}});
        let applied = json!({"metadata": {"managedFields": managed(json!({"f:data": {"f:a": {}}}))},
                             "data": {"a": "1"}});
        let diff = changed("v1", "ConfigMap", &Value::Null, &live, &applied).unwrap();
        assert!(diff.contains("-  b: '2'\n"), "{diff}");
    }

    #[test]
    fn secret_values_are_never_shown() {
        // As a server may record it: the keys set through stringData not among the fields.
        let fields = json!({"f:data": {"f:same": {}, "f:new": {}, "f:gone": {}}});
        let sent =
            json!({"data": {"same": "c2FtZQ==", "new": "bmV3"}, "stringData": {"text": "b"}});
        let live = json!({"metadata": {"managedFields": managed(fields.clone())},
                          "data": {"same": "c2FtZQ==", "new": "b2xk", "gone": "eA==", "text": "YQ=="}});
        let applied = json!({"metadata": {"managedFields": managed(fields)},
                             "data": {"same": "c2FtZQ==", "new": "bmV3", "text": "Yg=="}});
        let diff = changed("v1", "Secret", &sent, &live, &applied).unwrap();
        for secret in ["c2FtZQ", "b2xk", "bmV3", "eA==", "YQ==", "Yg=="] {
            assert!(!diff.contains(secret), "{diff}");
        }
        assert!(
            diff.contains("+  new: (sensitive value, changed)"),
            "{diff}"
        );
        assert!(diff.contains("-  gone: (sensitive value)"), "{diff}");
        assert!(
            diff.contains("+  text: (sensitive value, changed)"),
            "{diff}"
        );
        assert!(
            diff.contains("   same: (sensitive value, unchanged)"),
            "{diff}"
        );
        let create = created(
            "v1",
            "Secret",
            &json!({"kind": "Secret", "stringData": {"p": "hunter2"}}),
        );
        assert!(!create.contains("hunter2"), "{create}");
        assert!(
            create.contains("+  p: (sensitive value, added)"),
            "{create}"
        );
    }

    #[test]
    fn a_new_revision_that_changes_no_object_says_why_the_exit_code_says_changes() {
        let unchanged = ObjectDiff {
            api_version: "v1".to_string(),
            kind: "ConfigMap".to_string(),
            namespace: Some("apps".to_string()),
            name: "db".to_string(),
            action: Action::Unchanged,
            chart: Some("web".to_string()),
            template: Some("templates/db.yaml".to_string()),
            weight: None,
            diff: None,
        };
        let report = |hooks: usize| {
            let mut layers = vec![LayerDiff {
                chart: "web".to_string(),
                name: "database".to_string(),
                objects: vec![unchanged.clone()],
            }];
            for i in 0..hooks {
                layers[0].objects.push(ObjectDiff {
                    action: Action::Run,
                    name: format!("hook-{i}"),
                    ..unchanged.clone()
                });
            }
            Report {
                release: "apps/web".to_string(),
                operation: "upgrade".to_string(),
                from_revision: Some(1),
                rollback_to: None,
                new_revision: true,
                new_revision_reason: Some("spec.values changed".to_string()),
                changes: false,
                stages: vec![StageDiff {
                    stage: "layers".to_string(),
                    note: None,
                    layers,
                }],
                layer_order: Vec::new(),
                summary: Summary::default(),
            }
            .finish()
        };
        let text = format_text(&report(0), false);
        assert!(report(0).changes, "a new revision is a change");
        assert!(
            text.ends_with(
                "\n0 to create, 0 to change, 0 to delete, 1 unchanged, 0 hooks to run.\n\
                 A new revision would start: spec.values changed; nothing in the cluster would change.\n"
            ),
            "{text}"
        );
        let text = format_text(&report(2), false);
        assert!(
            text.ends_with(
                "A new revision would start: spec.values changed; no object would change, but its 2 hooks would run.\n"
            ),
            "{text}"
        );
        let json: Value = serde_json::from_str(&format_json(&report(0))).unwrap();
        assert_eq!(json["newRevision"], true);
        assert_eq!(json["changes"], true);
        assert_eq!(json["newRevisionReason"], "spec.values changed");
    }
}
