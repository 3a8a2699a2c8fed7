//! How a plan is built: charts and their subchart edges, then annotations per document, then the
//! layers of each chart, then one DAG over the whole tree for levels and order, then uninstall.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use petgraph::algo::{tarjan_scc, toposort};
use petgraph::graph::{DiGraph, NodeIndex};
use serde_json::{Map, Value};

use super::annotations::{self as ann, name_list};
use super::kind_order::{self, Direction};
use super::{
    ChartPlan, DEFAULT_LAYER, Diagnostic, Dialect, ExternalDependency, Grouping, Hook, Layer,
    LayerDependency, Plan, PlanError, Problem, Resource, Severity, UninstallStep, Wait,
};
use crate::chart::{ChartNode, ChartTree};
use crate::readiness;
use crate::render::{Document, HOOK_ANNOTATION, Rendered};

/// The annotations the readiness rules read.
const READINESS_KEYS: [&str; 6] = readiness::RULE_ANNOTATIONS;

/// The hook events Helm knows.
const HOOK_EVENTS: [&str; 10] = [
    "pre-install",
    "post-install",
    "pre-delete",
    "post-delete",
    "pre-upgrade",
    "post-upgrade",
    "pre-rollback",
    "post-rollback",
    "test",
    "test-success",
];

/// The hook delete policies Helm knows.
const DELETE_POLICIES: [&str; 3] = ["before-hook-creation", "hook-succeeded", "hook-failed"];

/// The hook output log policies Helm knows.
const OUTPUT_LOG_POLICIES: [&str; 2] = ["hook-succeeded", "hook-failed"];

/// The range KOTS allows for phases.
const PHASE_RANGE: std::ops::RangeInclusive<i64> = -9999..=9999;

struct ChartInfo<'t> {
    node: &'t ChartNode,
    parent: Option<usize>,
    subcharts: Vec<usize>,
    /// Sibling chart indices this chart's subtree waits for.
    after: Vec<usize>,
    /// Subchart indices this chart's own resources wait for.
    own_after: Vec<usize>,
    /// Its own layers (indices into `Builder::layers`), in local order.
    layers: Vec<usize>,
    dialect: Dialect,
}

/// What an object is, read once from it.
struct Identity {
    api_version: String,
    kind: String,
    name: String,
    namespace: Option<String>,
}

impl Identity {
    fn of(object: &Value) -> Self {
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_string();
        let metadata = object.get("metadata");
        Identity {
            api_version: text(object.get("apiVersion")),
            kind: text(object.get("kind")),
            name: text(metadata.and_then(|m| m.get("name"))),
            namespace: metadata
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str)
                .map(str::to_string),
        }
    }
}

/// Where a document is, for messages: `chart shop, templates/app.yaml Deployment/my-app`.
/// Borrowed, so that it costs nothing until a message is written.
#[derive(Clone, Copy)]
struct Origin<'a> {
    chart: &'a str,
    template: &'a str,
    kind: &'a str,
    name: &'a str,
}

impl<'a> Origin<'a> {
    fn of(document: &'a Document, identity: &'a Identity) -> Self {
        Origin {
            chart: &document.chart,
            template: &document.template,
            kind: &identity.kind,
            name: &identity.name,
        }
    }

    fn of_resource(resource: &'a Resource) -> Self {
        Origin {
            chart: &resource.chart,
            template: &resource.template,
            kind: &resource.kind,
            name: &resource.name,
        }
    }

    /// `Kind/name`.
    fn resource(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    fn at(&self) -> String {
        format!(
            "chart {}, {} {}/{}",
            self.chart, self.template, self.kind, self.name
        )
    }

    fn here(&self) -> String {
        format!("{} {}/{}", self.template, self.kind, self.name)
    }
}

/// A main resource with its sequencing annotations read.
struct Entry {
    chart: usize,
    /// Taken when the plan is assembled, after every message is written.
    resource: Option<Resource>,
    /// The place of its kind in the install order: Helm's list, then unlisted kinds by name.
    kind_rank: u32,
    /// The named layer and the key that named it.
    layer: Option<(String, &'static str)>,
    /// Named layers it depends on, with the key that named them.
    depends: Vec<(String, &'static str)>,
    weight: Option<i64>,
    phase: Option<i64>,
    deletion_phase: Option<i64>,
    external: Vec<ExternalDependency>,
}

impl Entry {
    fn origin(&self) -> Origin<'_> {
        match &self.resource {
            Some(resource) => Origin::of_resource(resource),
            None => Origin {
                chart: "",
                template: "",
                kind: "",
                name: "",
            },
        }
    }
}

/// The sequencing annotations of one document, read.
#[derive(Default)]
struct Read {
    layer: Option<(String, &'static str)>,
    depends: Vec<(String, &'static str)>,
    weight: Option<i64>,
    phase: Option<i64>,
    deletion_phase: Option<i64>,
    gate: bool,
    external: Vec<ExternalDependency>,
    hook_weight: Option<i64>,
}

struct LocalLayer {
    chart: usize,
    name: String,
    grouping: Grouping,
    members: Vec<usize>,
    deps: Vec<(usize, Wait)>,
    after_charts: Vec<usize>,
    external: Vec<ExternalDependency>,
}

pub(super) struct Builder<'t> {
    charts: Vec<ChartInfo<'t>>,
    index: HashMap<&'t str, usize>,
    layers: Vec<LocalLayer>,
    errors: Vec<Diagnostic>,
    warnings: Vec<Diagnostic>,
}

impl<'t> Builder<'t> {
    pub(super) fn new(tree: &'t ChartTree) -> Self {
        let mut builder = Builder {
            charts: Vec::new(),
            index: HashMap::default(),
            layers: Vec::new(),
            errors: Vec::new(),
            warnings: Vec::new(),
        };
        builder.add_chart(&tree.root, None);
        builder
    }

    fn add_chart(&mut self, node: &'t ChartNode, parent: Option<usize>) -> usize {
        let at = self.charts.len();
        self.charts.push(ChartInfo {
            node,
            parent,
            subcharts: Vec::new(),
            after: Vec::new(),
            own_after: Vec::new(),
            layers: Vec::new(),
            dialect: Dialect::None,
        });
        self.index.insert(node.path.as_str(), at);
        for sub in &node.subcharts {
            let child = self.add_chart(sub, Some(at));
            self.charts[at].subcharts.push(child);
        }
        at
    }

    fn error(
        &mut self,
        problem: Problem,
        chart: &str,
        file: Option<&str>,
        resource: Option<&str>,
        message: String,
    ) {
        self.errors.push(Diagnostic {
            severity: Severity::Error,
            problem,
            chart: chart.to_string(),
            file: file.map(str::to_string),
            resource: resource.map(str::to_string),
            message,
        });
    }

    fn warn(&mut self, problem: Problem, origin: Origin<'_>, message: String) {
        self.warnings.push(Diagnostic {
            severity: Severity::Warning,
            problem,
            chart: origin.chart.to_string(),
            file: Some(origin.template.to_string()),
            resource: Some(origin.resource()),
            message,
        });
    }

    fn error_at(&mut self, problem: Problem, origin: Origin<'_>, message: String) {
        self.error(
            problem,
            origin.chart,
            Some(origin.template),
            Some(&origin.resource()),
            message,
        );
    }

    pub(super) fn build(mut self, rendered: Rendered) -> Result<Plan, PlanError> {
        self.order_subcharts();

        let mut crds = Vec::with_capacity(rendered.crds.len());
        for document in rendered.crds {
            let identity = Identity::of(&document.object);
            let (resource, _) = self.resource(document, identity, true);
            crds.push(resource);
        }

        let mut hooks: Vec<Hook> = rendered
            .hooks
            .into_iter()
            .filter_map(|d| self.hook(d))
            .collect();
        // Helm's order (pkg/action/hooks.go): by weight, then by name; hooks of equal weight and
        // name keep the kind order they were sorted into first (a stable sort).
        hooks.sort_by(|a, b| {
            (
                a.weight,
                &a.resource.name,
                kind_order::sort_key(&a.resource.kind, Direction::Install),
            )
                .cmp(&(
                    b.weight,
                    &b.resource.name,
                    kind_order::sort_key(&b.resource.kind, Direction::Install),
                ))
        });

        let mut entries = Vec::with_capacity(rendered.resources.len());
        // Objects rendered twice, found before the documents are taken apart: the index of the
        // first document of each object.
        let identities: Vec<Identity> = rendered
            .resources
            .iter()
            .map(|d| Identity::of(&d.object))
            .collect();
        let mut duplicate_of: Vec<Option<usize>> = vec![None; rendered.resources.len()];
        {
            let mut seen: HashMap<(&str, &str, &str, &str), usize> =
                HashMap::with_capacity_and_hasher(identities.len(), Default::default());
            for (i, id) in identities.iter().enumerate() {
                let key = (
                    super::api_group(&id.api_version),
                    id.kind.as_str(),
                    id.namespace.as_deref().unwrap_or_default(),
                    id.name.as_str(),
                );
                match seen.entry(key) {
                    std::collections::hash_map::Entry::Occupied(first) => {
                        duplicate_of[i] = Some(*first.get());
                    }
                    std::collections::hash_map::Entry::Vacant(slot) => {
                        slot.insert(i);
                    }
                }
            }
        }
        let firsts: HashMap<usize, String> = duplicate_of
            .iter()
            .flatten()
            .map(|&first| {
                let d = &rendered.resources[first];
                (first, format!("chart {}, {}", d.chart, d.template))
            })
            .collect();
        // Documents come chart by chart: look a chart up only when it changes.
        let mut last_chart: Option<(String, usize)> = None;
        for (i, (document, identity)) in rendered.resources.into_iter().zip(identities).enumerate()
        {
            let origin = Origin::of(&document, &identity);
            let cached = match &last_chart {
                Some((path, at)) if *path == document.chart => Some(*at),
                _ => None,
            };
            let found = cached.or_else(|| {
                let at = self.index.get(document.chart.as_str()).copied()?;
                last_chart = Some((document.chart.clone(), at));
                Some(at)
            });
            let Some(chart) = found else {
                let message = format!(
                    "{}: chart {} is not an enabled chart of this release",
                    origin.here(),
                    origin.chart
                );
                self.error_at(Problem::BadDocument, origin, message);
                continue;
            };
            if let Some(first) = duplicate_of[i].and_then(|f| firsts.get(&f)) {
                let message = format!(
                    "{} is rendered twice: by {first} and by {}; a release can hold an object once",
                    origin.resource(),
                    origin.at()
                );
                self.error_at(Problem::DuplicateResource, origin, message);
                continue;
            }
            let (resource, read) = self.resource(document, identity, false);
            entries.push(Entry {
                chart,
                resource: Some(resource),
                kind_rank: 0,
                layer: read.layer,
                depends: read.depends,
                weight: read.weight,
                phase: read.phase,
                deletion_phase: read.deletion_phase,
                external: read.external,
            });
        }

        // Kinds ranked once, so that sorting a layer compares numbers.
        let unlisted: BTreeSet<&str> = entries
            .iter()
            .filter_map(|e| e.resource.as_ref())
            .map(|r| kind_order::sort_key(&r.kind, Direction::Install))
            .filter(|(_, name)| !name.is_empty())
            .map(|(_, name)| name)
            .collect();
        let unlisted: HashMap<String, u32> = unlisted
            .into_iter()
            .enumerate()
            .map(|(i, kind)| (kind.to_string(), i as u32))
            .collect();
        for entry in &mut entries {
            if let Some(resource) = &entry.resource {
                let (rank, _) = kind_order::sort_key(&resource.kind, Direction::Install);
                entry.kind_rank = unlisted
                    .get(&resource.kind)
                    .map_or(rank as u32, |&i| rank as u32 + i);
            }
        }

        let mut by_chart: Vec<Vec<usize>> = vec![Vec::new(); self.charts.len()];
        for (i, entry) in entries.iter().enumerate() {
            by_chart[entry.chart].push(i);
        }
        for (chart, members) in by_chart.iter().enumerate() {
            self.layer_chart(chart, members, &entries);
        }

        if !self.errors.is_empty() {
            return Err(PlanError {
                errors: self.errors,
                warnings: self.warnings,
            });
        }
        self.connect_charts();
        let levels = match self.levels() {
            Some(levels) => levels,
            None => {
                return Err(PlanError {
                    errors: self.errors,
                    warnings: self.warnings,
                });
            }
        };
        Ok(self.assemble(levels, entries, crds, hooks))
    }

    /// Resolves `dependencies[].depends-on` and `helm.sh/depends-on/subcharts` of every chart
    /// and checks the subchart graph of each chart for cycles.
    fn order_subcharts(&mut self) {
        for parent in 0..self.charts.len() {
            let node = self.charts[parent].node;
            let file = node.location.file("Chart.yaml");
            let subcharts = self.charts[parent].subcharts.clone();
            let mut names: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
            // A subchart's entry in `dependencies`. Helm does not select entries below a chart
            // without `dependencies`, but its subcharts' Chart.yaml still say how they are ordered.
            let entry = |child: &'t ChartNode| {
                child.dependency.as_ref().or_else(|| {
                    node.metadata
                        .dependencies
                        .iter()
                        .flatten()
                        .find(|d| d.effective_name() == child.name)
                })
            };
            for &child in &subcharts {
                let child_node = self.charts[child].node;
                names
                    .entry(child_node.name.as_str())
                    .or_default()
                    .push(child);
                if let Some(dep) = entry(child_node) {
                    for tag in &dep.tags {
                        names.entry(tag.as_str()).or_default().push(child);
                    }
                }
            }
            // Dependencies Helm rendered nothing of: edges to them are dropped.
            let mut disabled: HashSet<&str> = HashSet::default();
            for d in &node.not_rendered {
                disabled.insert(d.effective_name());
                disabled.extend(d.tags.iter().map(String::as_str));
            }
            let known = |names: &BTreeMap<&str, Vec<usize>>| {
                let mut all: Vec<&str> = names.keys().copied().collect();
                all.extend(disabled.iter().copied());
                all.sort_unstable();
                all.dedup();
                if all.is_empty() {
                    "it has no dependencies".to_string()
                } else {
                    format!("its dependencies and tags: {}", all.join(", "))
                }
            };

            let mut edges: Vec<(usize, usize)> = Vec::new();
            for &child in &subcharts {
                let child_node = self.charts[child].node;
                let Some(dep) = entry(child_node) else {
                    continue;
                };
                let wanted: Vec<String> = dep
                    .depends_on
                    .iter()
                    .flat_map(|n| n.split(','))
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty())
                    .collect();
                for name in wanted {
                    if name == child_node.name {
                        self.error(
                            Problem::Cycle,
                            &node.path,
                            Some(&file),
                            None,
                            format!(
                                "subchart cycle in chart {}: {name} -> {name} ({file}: dependency {name} depends-on itself)",
                                node.path
                            ),
                        );
                        continue;
                    }
                    match names.get(name.as_str()) {
                        Some(targets) => {
                            for &target in targets {
                                if target != child && !self.charts[child].after.contains(&target) {
                                    self.charts[child].after.push(target);
                                    edges.push((child, target));
                                }
                            }
                        }
                        None if disabled.contains(name.as_str()) => {}
                        None => {
                            let named_by = format!("dependency {} depends-on it", child_node.name);
                            self.unknown_subchart(node, &file, &name, &named_by, known(&names));
                        }
                    }
                }
            }

            if let Some(text) = node.metadata.annotations.get(ann::DEPENDS_ON_SUBCHARTS) {
                let value = Value::String(text.clone());
                match name_list(&value) {
                    Err(e) => self.error(
                        Problem::BadAnnotation,
                        &node.path,
                        Some(&file),
                        None,
                        format!(
                            "malformed {} in chart {} ({file}): {text:?}: {e}",
                            ann::DEPENDS_ON_SUBCHARTS,
                            node.path
                        ),
                    ),
                    Ok(wanted) => {
                        for name in wanted {
                            match names.get(name.as_ref()) {
                                Some(targets) => {
                                    for &target in targets {
                                        if !self.charts[parent].own_after.contains(&target) {
                                            self.charts[parent].own_after.push(target);
                                        }
                                    }
                                }
                                None if disabled.contains(name.as_ref()) => {}
                                None => {
                                    let named_by =
                                        format!("{} names it", ann::DEPENDS_ON_SUBCHARTS);
                                    self.unknown_subchart(
                                        node,
                                        &file,
                                        &name,
                                        &named_by,
                                        known(&names),
                                    );
                                }
                            }
                        }
                    }
                }
            }

            let local: Vec<usize> = subcharts.clone();
            let position = |c: usize| local.iter().position(|&x| x == c).unwrap_or(0);
            let local_edges: Vec<(usize, usize)> = edges
                .iter()
                .map(|&(from, to)| (position(from), position(to)))
                .collect();
            for cycle in find_cycles(local.len(), &local_edges) {
                let names: Vec<&str> = cycle
                    .iter()
                    .map(|&i| self.charts[local[i]].node.name.as_str())
                    .collect();
                let steps: Vec<String> = names
                    .windows(2)
                    .map(|w| format!("{} depends-on {}", w[0], w[1]))
                    .collect();
                let message = format!(
                    "subchart cycle in chart {}: {} ({file}: {})",
                    node.path,
                    names.join(" -> "),
                    steps.join(", ")
                );
                self.error(Problem::Cycle, &node.path, Some(&file), None, message);
            }
        }
    }

    /// A dependency on a subchart name or tag that chart `node` does not have.
    fn unknown_subchart(
        &mut self,
        node: &ChartNode,
        file: &str,
        name: &str,
        named_by: &str,
        known: String,
    ) {
        let message = format!(
            "unknown subchart {name:?} in chart {} ({file}): {named_by}, but chart {} has no dependency or tag of that name ({known})",
            node.path, node.path
        );
        self.error(
            Problem::UnknownSubchart,
            &node.path,
            Some(file),
            None,
            message,
        );
    }

    /// Reads the annotations of a document, checks their keys, and makes the resource to apply
    /// (without the sequencing annotations a real API server rejects).
    fn resource(
        &mut self,
        mut document: Document,
        identity: Identity,
        crd: bool,
    ) -> (Resource, Read) {
        let mut read = Read::default();
        // The annotations are taken out of the object while they are read, so that the rest of
        // the document can name it in messages.
        let taken = document
            .object
            .get_mut("metadata")
            .and_then(|metadata| metadata.get_mut("annotations"))
            .and_then(Value::as_object_mut)
            .map(std::mem::take);
        if let Some(mut annotations) = taken {
            let origin = Origin::of(&document, &identity);
            if !crd {
                self.read_annotations(&annotations, origin, &mut read);
            }
            let invalid: Vec<String> = annotations
                .keys()
                .filter(|key| !ann::valid_annotation_key(key))
                .cloned()
                .collect();
            for key in invalid {
                if !key.starts_with("helm.sh/depends-on/") {
                    let message = format!(
                        "annotation key {key:?} of {} is not a valid Kubernetes annotation key (an optional DNS prefix and '/', then a name of letters, digits, '-', '_' and '.'); a real API server rejects the object",
                        origin.at()
                    );
                    self.error_at(Problem::InvalidAnnotationKey, origin, message);
                }
                annotations.remove(&key);
            }
            if let Some(metadata) = document
                .object
                .get_mut("metadata")
                .and_then(Value::as_object_mut)
            {
                if annotations.is_empty() {
                    metadata.remove("annotations");
                } else if let Some(Value::Object(slot)) = metadata.get_mut("annotations") {
                    *slot = annotations;
                }
            }
        }
        let resource = Resource {
            api_version: identity.api_version,
            kind: identity.kind,
            name: identity.name,
            namespace: identity.namespace,
            gate: read.gate,
            chart: document.chart,
            template: document.template,
            object: document.object,
        };
        (resource, read)
    }

    fn read_annotations(
        &mut self,
        annotations: &Map<String, Value>,
        origin: Origin<'_>,
        read: &mut Read,
    ) {
        let bad = |builder: &mut Self, key: &str, value: &Value, why: String| {
            let message = format!(
                "malformed {key} in {}: {:?}: {why}",
                origin.at(),
                ann::text(value)
            );
            builder.error_at(Problem::BadAnnotation, origin, message);
        };
        let mut has_readiness = false;
        // One pass over the annotations (sorted by key, so `helm.sh/layer` comes before
        // `helm.sh/resource-group` and the messages do not depend on luck).
        for (key, value) in annotations {
            match key.as_str() {
                ann::LAYER | ann::RESOURCE_GROUP => {
                    let key = if key == ann::LAYER {
                        ann::LAYER
                    } else {
                        ann::RESOURCE_GROUP
                    };
                    let name = ann::text(value).trim().to_string();
                    if !ann::valid_layer_name(&name) {
                        bad(
                            self,
                            key,
                            value,
                            "a layer name is 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit".to_string(),
                        );
                        continue;
                    }
                    match &read.layer {
                        Some((other, other_key)) if *other != name => {
                            let why = format!(
                                "it names layer {name:?} but {other_key} names {other:?}; a resource is in one layer"
                            );
                            bad(self, key, value, why);
                        }
                        Some(_) => {}
                        None => read.layer = Some((name, key)),
                    }
                }
                ann::DEPENDS_ON_LAYERS | ann::DEPENDS_ON_RESOURCE_GROUPS => {
                    let key = if key == ann::DEPENDS_ON_LAYERS {
                        ann::DEPENDS_ON_LAYERS
                    } else {
                        ann::DEPENDS_ON_RESOURCE_GROUPS
                    };
                    match name_list(value) {
                        Ok(names) => {
                            for name in names {
                                if !read.depends.iter().any(|(n, _)| *n == name) {
                                    read.depends.push((name.into_owned(), key));
                                }
                            }
                        }
                        Err(why) => bad(self, key, value, why),
                    }
                }
                ann::WERF_WEIGHT => match ann::integer(value) {
                    Ok(weight) => read.weight = Some(weight),
                    Err(why) => bad(self, ann::WERF_WEIGHT, value, why),
                },
                ann::KOTS_CREATION_PHASE | ann::KOTS_DELETION_PHASE => {
                    let (key, slot) = if key == ann::KOTS_CREATION_PHASE {
                        (ann::KOTS_CREATION_PHASE, &mut read.phase)
                    } else {
                        (ann::KOTS_DELETION_PHASE, &mut read.deletion_phase)
                    };
                    match ann::integer(value) {
                        Ok(phase) if PHASE_RANGE.contains(&phase) => *slot = Some(phase),
                        Ok(_) => bad(
                            self,
                            key,
                            value,
                            "a phase is from -9999 to 9999".to_string(),
                        ),
                        Err(why) => bad(self, key, value, why),
                    }
                }
                // The readiness annotations are read by the readiness rules, below.
                readiness::SUCCESS_ANNOTATION
                | readiness::FAILURE_ANNOTATION
                | readiness::TIMEOUT_ANNOTATION
                | readiness::WAIT_FOR_READY_ANNOTATION
                | readiness::WAIT_FOR_PROPERTIES_ANNOTATION
                | readiness::READY_WHEN_ANNOTATION => has_readiness = true,
                ann::HOOK_WEIGHT => read.hook_weight = ann::integer(value).ok(),
                ann::DEPENDS_ON_SUBCHARTS => self.warn(
                    Problem::Ignored,
                    origin,
                    format!(
                        "{} on {} is ignored: it belongs in the annotations of Chart.yaml",
                        ann::DEPENDS_ON_SUBCHARTS,
                        origin.at()
                    ),
                ),
                _ => {
                    let Some(id) = key.strip_suffix(ann::WERF_EXTERNAL_RESOURCE) else {
                        continue;
                    };
                    match ann::object_reference(value) {
                        Ok(reference) => {
                            let namespace = annotations
                                .get(&format!("{id}{}", ann::WERF_EXTERNAL_NAMESPACE))
                                .map(|v| ann::text(v).trim().to_string())
                                .filter(|v| !v.is_empty());
                            read.external.push(ExternalDependency {
                                id: id.to_string(),
                                kind: reference.kind,
                                group: reference.group,
                                name: reference.name,
                                namespace,
                                declared_by: origin.resource(),
                                template: origin.template.to_string(),
                            });
                        }
                        Err(why) => bad(self, key, value, why),
                    }
                }
            }
        }
        if has_readiness {
            // Checked as the operator will use them, so a bad expression fails here, before
            // anything is applied.
            let strings: BTreeMap<String, String> = annotations
                .iter()
                .filter(|(key, _)| READINESS_KEYS.contains(&key.as_str()))
                .map(|(key, value)| (key.clone(), ann::text(value).into_owned()))
                .collect();
            match readiness::Rules::from_annotations(&strings) {
                Ok(rules) => read.gate = rules.waits_in_kots_phases(),
                Err(e) => {
                    let message = format!("{e}, in {}", origin.at());
                    self.error_at(Problem::BadAnnotation, origin, message);
                }
            }
        }
    }

    /// A hook as Helm reads it: events, delete and output-log policies split on commas, trimmed
    /// and lowercased. A hook with an event Helm does not know is skipped whole, as Helm skips
    /// it (None, with a warning).
    fn hook(&mut self, document: Document) -> Option<Hook> {
        let identity = Identity::of(&document.object);
        let origin = Origin::of(&document, &identity);
        let annotations = document
            .object
            .get("metadata")
            .and_then(|m| m.get("annotations"))
            .and_then(Value::as_object);
        let list_of = |key: &str| -> Option<Vec<String>> {
            let text = annotations.and_then(|a| a.get(key)).map(|v| ann::text(v))?;
            Some(
                text.split(',')
                    .map(|e| e.trim().to_ascii_lowercase())
                    .filter(|e| !e.is_empty())
                    .collect(),
            )
        };
        let events = list_of(HOOK_ANNOTATION).unwrap_or_default();
        let mut delete_policies = list_of(ann::HOOK_DELETE_POLICY).unwrap_or_default();
        let output_log_policies = list_of(ann::HOOK_OUTPUT_LOG_POLICY).unwrap_or_default();
        let weight_text = annotations
            .and_then(|a| a.get(ann::HOOK_WEIGHT))
            .map(|v| ann::text(v).into_owned());
        let ignored: Vec<&str> = ann::SEQUENCING_KEYS
            .iter()
            .copied()
            .chain([ann::KOTS_WAIT_FOR_PROPERTIES])
            .filter(|k| annotations.is_some_and(|a| a.contains_key(*k)))
            .collect();
        if let Some(event) = events.iter().find(|e| !HOOK_EVENTS.contains(&e.as_str())) {
            self.warn(
                Problem::BadAnnotation,
                origin,
                format!(
                    "unknown hook event {event:?} in {} of {}: Helm skips the whole object, and so does sequenced (events: {})",
                    HOOK_ANNOTATION,
                    origin.at(),
                    HOOK_EVENTS.join(", ")
                ),
            );
            return None;
        }
        if !ignored.is_empty() {
            self.warn(
                Problem::Ignored,
                origin,
                format!(
                    "{} on hook {} {} ignored: hooks run one at a time by {}",
                    ignored.join(", "),
                    origin.at(),
                    if ignored.len() == 1 { "is" } else { "are" },
                    ann::HOOK_WEIGHT
                ),
            );
        }
        let (resource, read) = self.resource(document, identity, false);
        let origin = Origin::of_resource(&resource);
        let weight = match (&weight_text, read.hook_weight) {
            (None, _) => 0,
            (Some(_), Some(weight)) => weight,
            (Some(text), None) => {
                self.warn(
                    Problem::BadAnnotation,
                    origin,
                    format!(
                        "{} of {} is {text:?}, not an integer; Helm uses 0",
                        ann::HOOK_WEIGHT,
                        origin.at()
                    ),
                );
                0
            }
        };
        let known = [
            (
                ann::HOOK_DELETE_POLICY,
                &delete_policies,
                &DELETE_POLICIES[..],
            ),
            (
                ann::HOOK_OUTPUT_LOG_POLICY,
                &output_log_policies,
                &OUTPUT_LOG_POLICIES[..],
            ),
        ];
        let unknown: Vec<String> = known
            .iter()
            .flat_map(|(key, given, known)| {
                given
                    .iter()
                    .filter(|p| !known.contains(&p.as_str()))
                    .map(move |policy| {
                        format!(
                            "unknown {key} {policy:?} of {}; Helm ignores it (policies: {})",
                            origin.at(),
                            known.join(", ")
                        )
                    })
            })
            .collect();
        for message in unknown {
            self.warn(Problem::BadAnnotation, origin, message);
        }
        if delete_policies.is_empty() {
            delete_policies.push("before-hook-creation".to_string());
        }
        Some(Hook {
            resource: Resource {
                gate: false,
                ..resource
            },
            events,
            weight,
            delete_policies,
            output_log_policies,
            external: read.external,
        })
    }

    /// Groups the main resources of one chart into layers and connects them.
    fn layer_chart(&mut self, chart: usize, members: &[usize], entries: &[Entry]) {
        if members.is_empty() {
            return;
        }
        let path = self.charts[chart].node.path.clone();
        let first = |pick: &dyn Fn(&Entry) -> Option<String>| {
            members
                .iter()
                .find_map(|&m| pick(&entries[m]).map(|what| (m, what)))
        };
        let named = first(&|e: &Entry| {
            e.layer
                .as_ref()
                .map(|(name, key)| format!("{key}: {name}"))
                .or_else(|| e.depends.first().map(|(_, key)| key.to_string()))
        });
        let weighted =
            first(&|e: &Entry| e.weight.map(|w| format!("{}: \"{w}\"", ann::WERF_WEIGHT)));
        let phased = first(&|e: &Entry| {
            e.phase
                .map(|p| format!("{}: \"{p}\"", ann::KOTS_CREATION_PHASE))
        });
        let present: Vec<(usize, String, Dialect)> = [
            named.map(|(m, w)| (m, w, Dialect::Layers)),
            weighted.map(|(m, w)| (m, w, Dialect::Weights)),
            phased.map(|(m, w)| (m, w, Dialect::Phases)),
        ]
        .into_iter()
        .flatten()
        .collect();
        if present.len() > 1 {
            let (a, what_a, _) = &present[0];
            let (b, what_b, _) = &present[1];
            let message = format!(
                "chart {path} mixes sequencing dialects: {} has {what_a} but {} has {what_b}; use named layers, werf.io/weight or kots.io/creation-phase, one per chart",
                entries[*a].origin().here(),
                entries[*b].origin().here(),
            );
            let origin = entries[*b].origin();
            self.error_at(Problem::MixedDialects, origin, message);
            return;
        }
        let dialect = present.first().map(|p| p.2).unwrap_or(Dialect::None);
        self.charts[chart].dialect = dialect;
        match dialect {
            Dialect::None => {
                let layer = self.new_layer(chart, DEFAULT_LAYER.to_string(), Grouping::Default);
                for &m in members {
                    self.add_member(layer, m, entries);
                }
            }
            Dialect::Weights | Dialect::Phases => {
                let mut groups: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
                for &m in members {
                    let value = match dialect {
                        Dialect::Weights => entries[m].weight,
                        _ => entries[m].phase,
                    };
                    groups.entry(value.unwrap_or(0)).or_default().push(m);
                }
                let mut previous: Option<usize> = None;
                for (value, group) in groups {
                    let (name, grouping, wait) = match dialect {
                        Dialect::Weights => (
                            format!("weight {value}"),
                            Grouping::Weight(value),
                            Wait::Ready,
                        ),
                        _ => (
                            format!("phase {value}"),
                            Grouping::Phase(value),
                            Wait::Gates,
                        ),
                    };
                    let layer = self.new_layer(chart, name, grouping);
                    for m in group {
                        self.add_member(layer, m, entries);
                    }
                    if let Some(before) = previous {
                        self.layers[layer].deps.push((before, wait));
                    }
                    previous = Some(layer);
                }
            }
            Dialect::Layers => self.named_layers(chart, &path, members, entries),
        }
    }

    fn new_layer(&mut self, chart: usize, name: String, grouping: Grouping) -> usize {
        let at = self.layers.len();
        self.layers.push(LocalLayer {
            chart,
            name,
            grouping,
            members: Vec::new(),
            deps: Vec::new(),
            after_charts: Vec::new(),
            external: Vec::new(),
        });
        self.charts[chart].layers.push(at);
        at
    }

    fn add_member(&mut self, layer: usize, member: usize, entries: &[Entry]) {
        self.layers[layer].members.push(member);
        for external in &entries[member].external {
            if !self.layers[layer].external.contains(external) {
                self.layers[layer].external.push(external.clone());
            }
        }
    }

    fn named_layers(&mut self, chart: usize, path: &str, members: &[usize], entries: &[Entry]) {
        let mut by_name: HashMap<&str, usize> = HashMap::default();
        let mut local: Vec<usize> = Vec::new();
        // Named layers in name order, so that layers of one level come out the same every time.
        let names: BTreeSet<&str> = members
            .iter()
            .filter_map(|&m| entries[m].layer.as_ref().map(|(name, _)| name.as_str()))
            .collect();
        for name in names {
            let layer = self.new_layer(chart, name.to_string(), Grouping::Named);
            by_name.insert(name, local.len());
            local.push(layer);
        }
        let mut default: Option<usize> = None;
        // Edges in the local numbering: dependent -> dependency, with the entry that declared it.
        let mut edges: Vec<(usize, usize)> = Vec::new();
        let mut declared_by: HashMap<(usize, usize), usize> = HashMap::default();
        for &m in members {
            let entry = &entries[m];
            let own = match &entry.layer {
                Some((name, _)) => by_name[name.as_str()],
                None => {
                    if !entry.depends.is_empty() {
                        let keys: BTreeSet<&str> = entry.depends.iter().map(|(_, k)| *k).collect();
                        let keys: Vec<&str> = keys.into_iter().collect();
                        self.warn(
                            Problem::Ignored,
                            entry.origin(),
                            format!(
                                "{} has {} but no {}: it goes into layer {DEFAULT_LAYER} of chart {path}, after every layer",
                                entry.origin().at(),
                                keys.join(" and "),
                                ann::LAYER
                            ),
                        );
                    }
                    *default.get_or_insert_with(|| {
                        let layer =
                            self.new_layer(chart, DEFAULT_LAYER.to_string(), Grouping::Default);
                        local.push(layer);
                        local.len() - 1
                    })
                }
            };
            self.add_member(local[own], m, entries);
            if entry.layer.is_none() {
                continue;
            }
            for (name, key) in &entry.depends {
                match by_name.get(name.as_str()) {
                    Some(&target) => {
                        if !edges.contains(&(own, target)) {
                            edges.push((own, target));
                            declared_by.insert((own, target), m);
                        }
                    }
                    None => {
                        let mut layers: Vec<&str> = by_name.keys().copied().collect();
                        layers.sort_unstable();
                        let message = format!(
                            "unknown layer {name:?} in chart {path}: {} has {key} {name:?}, but no resource of chart {path} is in that layer (its layers: {})",
                            entry.origin().here(),
                            layers.join(", ")
                        );
                        let origin = entry.origin();
                        self.error_at(Problem::UnknownLayer, origin, message);
                    }
                }
            }
        }
        for cycle in find_cycles(local.len(), &edges) {
            let names: Vec<&str> = cycle
                .iter()
                .map(|&i| self.layers[local[i]].name.as_str())
                .collect();
            let details: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let by = declared_by
                        .get(&(w[0], w[1]))
                        .map(|&m| entries[m].origin().here())
                        .unwrap_or_default();
                    format!(
                        "{by}: {} depends on {}",
                        self.layers[local[w[0]]].name, self.layers[local[w[1]]].name
                    )
                })
                .collect();
            let first = cycle
                .windows(2)
                .find_map(|w| declared_by.get(&(w[0], w[1])))
                .map(|&m| entries[m].origin());
            let message = format!(
                "layer cycle in chart {path}: {} ({})",
                names.join(" -> "),
                details.join("; ")
            );
            match first {
                Some(origin) => self.error_at(Problem::Cycle, origin, message),
                None => self.error(Problem::Cycle, path, None, None, message),
            }
        }
        for &(from, to) in &edges {
            self.layers[local[from]].deps.push((local[to], Wait::Ready));
        }
        if let Some(default) = default {
            // After every named layer: it is enough to wait for those nothing else waits for.
            let waited_on: HashSet<usize> = edges.iter().map(|&(_, to)| to).collect();
            for (i, &layer) in local.iter().enumerate() {
                if i != default && !waited_on.contains(&i) {
                    self.layers[local[default]].deps.push((layer, Wait::Ready));
                }
            }
        }
    }

    /// Gives the first layers of every chart the chart subtrees they wait for.
    fn connect_charts(&mut self) {
        for chart in &mut self.charts {
            chart.after.sort_unstable();
            chart.own_after.sort_unstable();
        }
        for chart in 0..self.charts.len() {
            let mut after: Vec<usize> = self.charts[chart].own_after.clone();
            let mut at = Some(chart);
            while let Some(c) = at {
                after.extend(self.charts[c].after.iter().copied());
                at = self.charts[c].parent;
            }
            after.sort_unstable();
            after.dedup();
            if after.is_empty() {
                continue;
            }
            for &layer in &self.charts[chart].layers {
                if self.layers[layer].deps.is_empty() {
                    self.layers[layer].after_charts = after.clone();
                }
            }
        }
    }

    /// The deploy order of the layers with the level of each, over the whole tree. None after a
    /// cycle that only shows across charts (reported).
    fn levels(&mut self) -> Option<Vec<(usize, usize)>> {
        let layers = self.layers.len();
        let mut graph: DiGraph<(), ()> =
            DiGraph::with_capacity(layers + self.charts.len(), layers * 2);
        for _ in 0..layers + self.charts.len() {
            graph.add_node(());
        }
        let done = |chart: usize| NodeIndex::new(layers + chart);
        for (i, layer) in self.layers.iter().enumerate() {
            for &(dep, _) in &layer.deps {
                graph.add_edge(NodeIndex::new(dep), NodeIndex::new(i), ());
            }
            graph.add_edge(NodeIndex::new(i), done(layer.chart), ());
            for &chart in &layer.after_charts {
                graph.add_edge(done(chart), NodeIndex::new(i), ());
            }
        }
        for (c, chart) in self.charts.iter().enumerate() {
            if let Some(parent) = chart.parent {
                graph.add_edge(done(c), done(parent), ());
            }
        }
        let sorted = match toposort(&graph, None) {
            Ok(sorted) => sorted,
            Err(cycle) => {
                let at = cycle.node_id().index();
                let what = if at < layers {
                    let l = &self.layers[at];
                    format!(
                        "layer {} of chart {}",
                        l.name, self.charts[l.chart].node.path
                    )
                } else {
                    format!("chart {}", self.charts[at - layers].node.path)
                };
                let root = self.charts[0].node.path.clone();
                self.error(
                    Problem::Cycle,
                    &root,
                    None,
                    None,
                    format!("cycle across the charts of {root}, through {what}"),
                );
                return None;
            }
        };
        let mut level = vec![0usize; graph.node_count()];
        for node in sorted {
            let i = node.index();
            let before = graph
                .neighbors_directed(node, petgraph::Direction::Incoming)
                .map(|p| level[p.index()])
                .max()
                .unwrap_or(0);
            level[i] = if i < layers { before + 1 } else { before };
        }
        let mut order: Vec<(usize, usize)> = (0..layers).map(|i| (i, level[i])).collect();
        order.sort_by_key(|&(i, level)| (level, i));
        Some(order)
    }

    fn assemble(
        self,
        levels: Vec<(usize, usize)>,
        mut entries: Vec<Entry>,
        crds: Vec<Resource>,
        hooks: Vec<Hook>,
    ) -> Plan {
        let mut position = vec![0usize; self.layers.len()];
        for (at, &(layer, _)) in levels.iter().enumerate() {
            position[layer] = at;
        }
        let chart_paths: Vec<String> = self.charts.iter().map(|c| c.node.path.clone()).collect();
        let mut resources: Vec<Resource> = Vec::with_capacity(entries.len());
        let mut layers: Vec<Layer> = Vec::with_capacity(self.layers.len());
        // Where each entry went, for uninstall.
        let mut placed = vec![0usize; entries.len()];
        for &(l, level) in &levels {
            let local = &self.layers[l];
            let mut keyed: Vec<(u32, usize)> = local
                .members
                .iter()
                .map(|&m| (entries[m].kind_rank, m))
                .collect();
            // Kind order; documents of one kind keep their order.
            keyed.sort_unstable();
            let members: Vec<usize> = keyed.into_iter().map(|(_, m)| m).collect();
            let mut indices = Vec::with_capacity(members.len());
            for m in members {
                if let Some(resource) = entries[m].resource.take() {
                    placed[m] = resources.len();
                    indices.push(resources.len());
                    resources.push(resource);
                }
            }
            let mut depends_on: Vec<LayerDependency> = local
                .deps
                .iter()
                .map(|&(dep, wait)| LayerDependency {
                    layer: position[dep],
                    wait,
                })
                .collect();
            depends_on.sort_by_key(|d| d.layer);
            layers.push(Layer {
                chart: chart_paths[local.chart].clone(),
                name: local.name.clone(),
                grouping: local.grouping,
                level,
                resources: indices,
                depends_on,
                after_charts: local
                    .after_charts
                    .iter()
                    .map(|&c| chart_paths[c].clone())
                    .collect(),
                external: local.external.clone(),
            });
        }
        let charts: Vec<ChartPlan> = self
            .charts
            .iter()
            .map(|c| {
                let mut own: Vec<usize> = c.layers.iter().map(|&l| position[l]).collect();
                own.sort_unstable();
                ChartPlan {
                    path: c.node.path.clone(),
                    name: c.node.name.clone(),
                    version: c.node.metadata.version.clone(),
                    dialect: c.dialect,
                    layers: own,
                    after: c.after.iter().map(|&a| chart_paths[a].clone()).collect(),
                    own_after: c
                        .own_after
                        .iter()
                        .map(|&a| chart_paths[a].clone())
                        .collect(),
                    disabled: c
                        .node
                        .not_rendered
                        .iter()
                        .map(|d| d.effective_name().to_string())
                        .collect(),
                }
            })
            .collect();
        let deletion: Vec<Option<i64>> = entries.iter().map(|e| e.deletion_phase).collect();
        let entry_chart: Vec<usize> = entries.iter().map(|e| e.chart).collect();
        let mut plan = Plan {
            chart: chart_paths.first().cloned().unwrap_or_default(),
            crds,
            hooks,
            resources,
            layers,
            charts,
            uninstall: Vec::new(),
            warnings: self.warnings,
        };
        plan.uninstall = uninstall(&plan, &placed, &deletion, &entry_chart);
        plan
    }
}

/// The uninstall steps: one per layer in reverse DAG order, except in charts that use
/// `kots.io/deletion-phase`, whose resources are deleted by phase.
fn uninstall(
    plan: &Plan,
    placed: &[usize],
    deletion: &[Option<i64>],
    entry_chart: &[usize],
) -> Vec<UninstallStep> {
    let mut phase_of = vec![None; plan.resources.len()];
    let mut chart_has_phases: HashSet<usize> = HashSet::default();
    for (entry, &at) in placed.iter().enumerate() {
        phase_of[at] = deletion[entry];
        if deletion[entry].is_some() {
            chart_has_phases.insert(entry_chart[entry]);
        }
    }
    let phased: HashSet<&str> = plan
        .charts
        .iter()
        .enumerate()
        .filter(|(i, _)| chart_has_phases.contains(i))
        .map(|(_, c)| c.path.as_str())
        .collect();
    let uninstall_key =
        |r: usize| kind_order::sort_key(&plan.resources[r].kind, Direction::Uninstall);

    let mut steps: Vec<UninstallStep> = Vec::new();
    // For each layer, the steps holding its resources.
    let mut steps_of: Vec<Vec<usize>> = vec![Vec::new(); plan.layers.len()];
    for (l, layer) in plan.layers.iter().enumerate().rev() {
        if phased.contains(layer.chart.as_str()) {
            continue;
        }
        let mut resources = layer.resources.clone();
        resources.reverse();
        resources.sort_by_cached_key(|&r| uninstall_key(r));
        steps_of[l].push(steps.len());
        steps.push(UninstallStep {
            chart: layer.chart.clone(),
            name: layer.name.clone(),
            resources,
            after: Vec::new(),
        });
    }
    for chart in plan.charts.iter().rev() {
        if !phased.contains(chart.path.as_str()) {
            continue;
        }
        let mut groups: BTreeMap<i64, Vec<(usize, usize)>> = BTreeMap::new();
        for &l in &chart.layers {
            for &r in &plan.layers[l].resources {
                groups
                    .entry(phase_of[r].unwrap_or(0))
                    .or_default()
                    .push((l, r));
            }
        }
        let mut previous: Option<usize> = None;
        for (phase, mut members) in groups {
            // Reverse creation order: later layers first, then Helm's uninstall kind order.
            members.sort_by_cached_key(|&(l, r)| (std::cmp::Reverse(l), uninstall_key(r)));
            let at = steps.len();
            for &(l, _) in &members {
                if !steps_of[l].contains(&at) {
                    steps_of[l].push(at);
                }
            }
            steps.push(UninstallStep {
                chart: chart.path.clone(),
                name: format!("deletion phase {phase}"),
                resources: members.into_iter().map(|(_, r)| r).collect(),
                after: previous.into_iter().collect(),
            });
            previous = Some(at);
        }
    }
    // A layer is deleted only after every layer that waits for it is gone.
    let add = |steps: &mut Vec<UninstallStep>, first: usize, then: usize| {
        for &s in &steps_of[then] {
            for &t in &steps_of[first] {
                if s != t && !steps[s].after.contains(&t) {
                    steps[s].after.push(t);
                }
            }
        }
    };
    for (m, layer) in plan.layers.iter().enumerate() {
        if !phased.contains(layer.chart.as_str()) {
            for dep in &layer.depends_on {
                add(&mut steps, m, dep.layer);
            }
        }
        for chart in &layer.after_charts {
            for (l, other) in plan.layers.iter().enumerate() {
                if super::in_subtree(&other.chart, chart) {
                    add(&mut steps, m, l);
                }
            }
        }
    }
    order_steps(steps)
}

/// Sorts steps so that every step comes after those it waits for, keeping the given order
/// where there is no relation.
fn order_steps(steps: Vec<UninstallStep>) -> Vec<UninstallStep> {
    let n = steps.len();
    let mut level = vec![0usize; n];
    // Longest path by repeated relaxation in creation order; the steps form a DAG because the
    // layers do.
    let mut graph: DiGraph<(), ()> = DiGraph::with_capacity(n, n);
    for _ in 0..n {
        graph.add_node(());
    }
    for (s, step) in steps.iter().enumerate() {
        for &t in &step.after {
            graph.add_edge(NodeIndex::new(t), NodeIndex::new(s), ());
        }
    }
    let sorted = toposort(&graph, None).unwrap_or_else(|_| graph.node_indices().collect());
    for node in sorted {
        let before = graph
            .neighbors_directed(node, petgraph::Direction::Incoming)
            .map(|p| level[p.index()] + 1)
            .max()
            .unwrap_or(0);
        level[node.index()] = before;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&s| (level[s], s));
    let mut position = vec![0usize; n];
    for (at, &s) in order.iter().enumerate() {
        position[s] = at;
    }
    let mut slots: Vec<Option<UninstallStep>> = steps.into_iter().map(Some).collect();
    order
        .iter()
        .filter_map(|&s| slots[s].take())
        .map(|mut step| {
            step.after = step.after.iter().map(|&t| position[t]).collect();
            step.after.sort_unstable();
            step
        })
        .collect()
}

/// One cycle per strongly connected component that has one: node lists that start and end with
/// the same node, following the edges `(from, to)`.
pub(super) fn find_cycles(nodes: usize, edges: &[(usize, usize)]) -> Vec<Vec<usize>> {
    if edges.is_empty() {
        return Vec::new();
    }
    let mut graph: DiGraph<(), ()> = DiGraph::with_capacity(nodes, edges.len());
    for _ in 0..nodes {
        graph.add_node(());
    }
    for &(from, to) in edges {
        graph.add_edge(NodeIndex::new(from), NodeIndex::new(to), ());
    }
    let mut cycles = Vec::new();
    for component in tarjan_scc(&graph) {
        let members: HashSet<usize> = component.iter().map(|n| n.index()).collect();
        let Some(&start) = members.iter().min() else {
            continue;
        };
        if members.len() == 1 && !edges.contains(&(start, start)) {
            continue;
        }
        // Shortest way from start back to start inside the component.
        let mut parent: HashMap<usize, usize> = HashMap::default();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut last = None;
        'search: while let Some(at) = queue.pop_front() {
            let mut next: Vec<usize> = graph
                .neighbors(NodeIndex::new(at))
                .map(|n| n.index())
                .filter(|n| members.contains(n))
                .collect();
            next.sort_unstable();
            for n in next {
                if n == start {
                    last = Some(at);
                    break 'search;
                }
                if let std::collections::hash_map::Entry::Vacant(slot) = parent.entry(n) {
                    slot.insert(at);
                    queue.push_back(n);
                }
            }
        }
        let Some(mut at) = last else {
            continue;
        };
        let mut path = vec![start];
        while at != start {
            path.push(at);
            at = parent.get(&at).copied().unwrap_or(start);
        }
        path.push(start);
        // `path` runs backwards from the end; turn it around.
        path.reverse();
        cycles.push(path);
    }
    cycles.sort();
    cycles
}

#[cfg(test)]
mod tests {
    use super::find_cycles;

    #[test]
    fn cycles_follow_the_edges() {
        assert_eq!(find_cycles(3, &[(0, 1), (1, 2)]), Vec::<Vec<usize>>::new());
        assert_eq!(find_cycles(2, &[(0, 1), (1, 0)]), vec![vec![0, 1, 0]]);
        assert_eq!(find_cycles(1, &[(0, 0)]), vec![vec![0, 0]]);
        assert_eq!(
            find_cycles(3, &[(0, 1), (1, 2), (2, 0)]),
            vec![vec![0, 1, 2, 0]]
        );
        assert_eq!(
            find_cycles(5, &[(0, 1), (1, 0), (2, 3), (3, 4), (4, 2)]),
            vec![vec![0, 1, 0], vec![2, 3, 4, 2]]
        );
    }
}
