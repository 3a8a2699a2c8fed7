//! Field ownership: `metadata.managedFields` (fieldsV1 sets per manager), what an Update takes
//! over, and server-side apply (merge, conflicts, removal of fields a manager stopped applying).
//!
//! A simplified structured-merge-diff: the shape of each node (struct, granular map, atomic,
//! set list, associative list with keys) comes from a few rules for built-in kinds and from the
//! openAPIV3Schema for custom resources.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::errors::quote;

/// What the server knows about the kind being written, to decide node shapes.
#[derive(Clone, Copy)]
pub struct ShapeCtx<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    /// openAPIV3Schema of a custom resource version.
    pub schema: Option<&'a Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    Scalar,
    /// Fixed fields: never owned as a whole.
    Struct,
    /// Granular map (labels, data, ...): owned as a whole when a manager created it (`.`).
    Map,
    AtomicMap,
    AtomicList,
    /// List of scalars merged by value (`v:`), such as finalizers.
    SetList,
    /// List of objects merged by key fields (`k:`), such as containers.
    AssocList(Vec<String>),
}

const ITEM: &str = "[]";

fn builtin_shape(ctx: ShapeCtx, path: &[String], value: &Value) -> Shape {
    let names: Vec<&str> = path
        .iter()
        .map(String::as_str)
        .filter(|p| *p != ITEM)
        .collect();
    let last = names.last().copied().unwrap_or("");
    let parent = if names.len() >= 2 {
        names[names.len() - 2]
    } else {
        ""
    };
    match value {
        Value::Object(_) => {
            if path.is_empty() || path.last().map(String::as_str) == Some(ITEM) {
                return Shape::Struct;
            }
            match last {
                "labels" | "annotations" | "matchLabels" | "nodeSelector" | "limits"
                | "requests" | "capacity" | "allocatable" | "hard" | "used" | "parameters" => {
                    Shape::Map
                }
                "data" | "binaryData" | "stringData" if names.len() == 1 => Shape::Map,
                "selector"
                    if ctx.group.is_empty()
                        && matches!(ctx.kind, "Service" | "ReplicationController") =>
                {
                    Shape::Map
                }
                "selector" | "podSelector" | "namespaceSelector" | "labelSelector" => {
                    Shape::AtomicMap
                }
                _ => Shape::Struct,
            }
        }
        Value::Array(_) => match last {
            "finalizers" if names.len() == 2 && parent == "metadata" => Shape::SetList,
            "ownerReferences" => Shape::AssocList(vec!["uid".into()]),
            "containers"
            | "initContainers"
            | "ephemeralContainers"
            | "env"
            | "volumes"
            | "imagePullSecrets" => Shape::AssocList(vec!["name".into()]),
            "volumeMounts" => Shape::AssocList(vec!["mountPath".into()]),
            "volumeDevices" => Shape::AssocList(vec!["devicePath".into()]),
            "ports"
                if matches!(
                    parent,
                    "containers" | "initContainers" | "ephemeralContainers"
                ) =>
            {
                Shape::AssocList(vec!["containerPort".into(), "protocol".into()])
            }
            "ports" if ctx.group.is_empty() && ctx.kind == "Service" && names.len() == 2 => {
                Shape::AssocList(vec!["port".into(), "protocol".into()])
            }
            "conditions" => Shape::AssocList(vec!["type".into()]),
            // `+listType=map +listMapKey=name` in admissionregistration/v1: a certificate Job
            // that patches one webhook's `caBundle` owns that field, not the list.
            "webhooks" if ctx.group == "admissionregistration.k8s.io" && names.len() == 1 => {
                Shape::AssocList(vec!["name".into()])
            }
            "hostAliases" => Shape::AssocList(vec!["ip".into()]),
            "topologySpreadConstraints" => {
                Shape::AssocList(vec!["topologyKey".into(), "whenUnsatisfiable".into()])
            }
            _ => Shape::AtomicList,
        },
        _ => Shape::Scalar,
    }
}

/// The schema node at `path` (field names, `[]` for list items).
pub fn schema_at<'a>(schema: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = schema;
    for p in path {
        if p == ITEM {
            cur = cur.get("items")?;
        } else if let Some(s) = cur.get("properties").and_then(|ps| ps.get(p)) {
            cur = s;
        } else if let Some(s) = cur.get("additionalProperties").filter(|a| a.is_object()) {
            cur = s;
        } else {
            return None;
        }
    }
    Some(cur)
}

pub fn shape(ctx: ShapeCtx, path: &[String], value: &Value) -> Shape {
    let Some(schema) = ctx.schema else {
        return builtin_shape(ctx, path, value);
    };
    if path.first().map(String::as_str) == Some("metadata") {
        return builtin_shape(ctx, path, value);
    }
    let node = schema_at(schema, path);
    let ext = |k: &str| node.and_then(|n| n.get(k));
    match value {
        Value::Object(_) => {
            if ext("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic") {
                Shape::AtomicMap
            } else if path.is_empty()
                || (ext("properties").is_some()
                    && ext("x-kubernetes-preserve-unknown-fields") != Some(&Value::Bool(true)))
            {
                Shape::Struct
            } else {
                Shape::Map
            }
        }
        Value::Array(_) => match ext("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => Shape::SetList,
            Some("map") => Shape::AssocList(
                ext("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|k| k.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
            _ => Shape::AtomicList,
        },
        _ => Shape::Scalar,
    }
}

/// One step of a field path, ordered like the fieldsV1 keys.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum PE {
    Field(String),
    /// `k:{"name":"x"}`: the compact JSON of the key fields.
    Key(String),
    /// `v:"x"`: the compact JSON of the value.
    Value(String),
    Index(usize),
}

impl PE {
    fn fields_key(&self) -> String {
        match self {
            PE::Field(f) => format!("f:{f}"),
            PE::Key(k) => format!("k:{k}"),
            PE::Value(v) => format!("v:{v}"),
            PE::Index(i) => format!("i:{i}"),
        }
    }

    fn parse(s: &str) -> Option<PE> {
        let (t, rest) = s.split_at_checked(2)?;
        match t {
            "f:" => Some(PE::Field(rest.into())),
            "k:" => Some(PE::Key(rest.into())),
            "v:" => Some(PE::Value(rest.into())),
            "i:" => rest.parse().ok().map(PE::Index),
            _ => None,
        }
    }

    /// As structured-merge-diff prints it in conflicts: `.data.k`, `[name="x"]`, `[="v"]`.
    fn display(&self) -> String {
        match self {
            PE::Field(f) => format!(".{f}"),
            PE::Key(k) => {
                let fields: Vec<String> = serde_json::from_str::<Map<String, Value>>(k)
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
                    .unwrap_or_default();
                format!("[{}]", fields.join(","))
            }
            PE::Value(v) => format!("[={v}]"),
            PE::Index(i) => format!("[{i}]"),
        }
    }

    fn matches_item(&self, item: &Value) -> bool {
        match self {
            PE::Key(k) => serde_json::from_str::<Map<String, Value>>(k).is_ok_and(|m| {
                m.iter().all(|(f, want)| {
                    let have = item.get(f).cloned().or_else(|| default_key(f));
                    have.as_ref() == Some(want)
                })
            }),
            PE::Value(v) => serde_json::to_string(item).is_ok_and(|s| &s == v),
            _ => false,
        }
    }
}

fn default_key(field: &str) -> Option<Value> {
    (field == "protocol").then(|| json!("TCP"))
}

/// The key path element of an item of an associative list.
fn item_key(item: &Value, keys: &[String]) -> PE {
    let mut sorted: Vec<&String> = keys.iter().collect();
    sorted.sort();
    let mut m = Map::new();
    for k in sorted {
        if let Some(v) = item.get(k).cloned().or_else(|| default_key(k)) {
            m.insert(k.clone(), v);
        }
    }
    PE::Key(serde_json::to_string(&Value::Object(m)).unwrap_or_default())
}

pub fn path_display(path: &[PE]) -> String {
    path.iter().map(PE::display).collect()
}

/// A set of field paths, as a tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSet {
    member: bool,
    children: BTreeMap<PE, FieldSet>,
}

impl FieldSet {
    pub fn insert(&mut self, path: &[PE]) {
        match path.split_first() {
            None => self.member = true,
            Some((head, rest)) => self.children.entry(head.clone()).or_default().insert(rest),
        }
    }

    fn node(&self, path: &[PE]) -> Option<&FieldSet> {
        match path.split_first() {
            None => Some(self),
            Some((head, rest)) => self.children.get(head)?.node(rest),
        }
    }

    pub fn contains(&self, path: &[PE]) -> bool {
        self.node(path).is_some_and(|n| n.member)
    }

    /// Whether `path` or anything under it is in the set.
    pub fn covers(&self, path: &[PE]) -> bool {
        self.node(path).is_some_and(|n| !n.is_empty())
    }

    pub fn is_empty(&self) -> bool {
        !self.member && self.children.values().all(FieldSet::is_empty)
    }

    pub fn remove(&mut self, path: &[PE]) {
        match path.split_first() {
            None => self.member = false,
            Some((head, rest)) => {
                if let Some(c) = self.children.get_mut(head) {
                    c.remove(rest);
                    if c.is_empty() {
                        self.children.remove(head);
                    }
                }
            }
        }
    }

    /// Removes `path` and everything under it.
    pub fn remove_tree(&mut self, path: &[PE]) {
        match path.split_first() {
            None => *self = FieldSet::default(),
            Some((head, rest)) => {
                if rest.is_empty() {
                    self.children.remove(head);
                } else if let Some(c) = self.children.get_mut(head) {
                    c.remove_tree(rest);
                    if c.is_empty() {
                        self.children.remove(head);
                    }
                }
            }
        }
    }

    pub fn members(&self) -> Vec<Vec<PE>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<PE>, out: &mut Vec<Vec<PE>>) {
        if self.member {
            out.push(prefix.clone());
        }
        for (k, c) in &self.children {
            prefix.push(k.clone());
            c.collect(prefix, out);
            prefix.pop();
        }
    }

    pub fn union(&mut self, other: &FieldSet) {
        for p in other.members() {
            self.insert(&p);
        }
    }

    pub fn subtract(&mut self, other: &FieldSet) {
        for p in other.members() {
            self.remove(&p);
        }
    }

    pub fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        if self.member && !self.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, c) in &self.children {
            if !c.is_empty() {
                m.insert(k.fields_key(), c.to_fields_v1());
            }
        }
        Value::Object(m)
    }

    pub fn from_fields_v1(v: &Value) -> FieldSet {
        let mut s = FieldSet::default();
        let Some(m) = v.as_object() else { return s };
        if m.is_empty() {
            s.member = true;
        }
        for (k, c) in m {
            if k == "." {
                s.member = true;
            } else if let Some(pe) = PE::parse(k) {
                s.children.insert(pe, FieldSet::from_fields_v1(c));
            }
        }
        s
    }
}

/// The value at `path`, when present.
pub fn get_path<'a>(v: &'a Value, path: &[PE]) -> Option<&'a Value> {
    let mut cur = v;
    for pe in path {
        cur = match (pe, cur) {
            (PE::Field(f), Value::Object(m)) => m.get(f).filter(|x| !x.is_null())?,
            (PE::Index(i), Value::Array(a)) => a.get(*i)?,
            (pe @ (PE::Key(_) | PE::Value(_)), Value::Array(a)) => {
                a.iter().find(|i| pe.matches_item(i))?
            }
            _ => return None,
        };
    }
    Some(cur)
}

/// Removes the node at `path` from `v`; returns whether something was removed.
pub fn remove_path(v: &mut Value, path: &[PE]) -> bool {
    let Some((last, parent)) = path.split_last() else {
        return false;
    };
    let mut cur = v;
    for pe in parent {
        cur = match (pe, cur) {
            (PE::Field(f), Value::Object(m)) => match m.get_mut(f) {
                Some(x) => x,
                None => return false,
            },
            (PE::Index(i), Value::Array(a)) => match a.get_mut(*i) {
                Some(x) => x,
                None => return false,
            },
            (pe @ (PE::Key(_) | PE::Value(_)), Value::Array(a)) => {
                match a.iter_mut().find(|i| pe.matches_item(i)) {
                    Some(x) => x,
                    None => return false,
                }
            }
            _ => return false,
        };
    }
    match (last, cur) {
        (PE::Field(f), Value::Object(m)) => m.remove(f).is_some(),
        (PE::Index(i), Value::Array(a)) if *i < a.len() => {
            a.remove(*i);
            true
        }
        (pe @ (PE::Key(_) | PE::Value(_)), Value::Array(a)) => {
            let before = a.len();
            a.retain(|i| !pe.matches_item(i));
            a.len() != before
        }
        _ => false,
    }
}

/// The fields an applied configuration sets: leaves, empty containers and list items.
pub fn applied_set(ctx: ShapeCtx, v: &Value) -> FieldSet {
    let mut out = FieldSet::default();
    walk_applied(ctx, &mut Vec::new(), &mut Vec::new(), v, &mut out);
    out
}

fn walk_applied(
    ctx: ShapeCtx,
    path: &mut Vec<String>,
    fpath: &mut Vec<PE>,
    v: &Value,
    out: &mut FieldSet,
) {
    match shape(ctx, path, v) {
        Shape::Struct | Shape::Map => {
            let m = v
                .as_object()
                .map(|m| m.iter().filter(|(_, x)| !x.is_null()).collect::<Vec<_>>())
                .unwrap_or_default();
            if m.is_empty() && !fpath.is_empty() {
                out.insert(fpath);
            }
            for (k, x) in m {
                path.push(k.clone());
                fpath.push(PE::Field(k.clone()));
                walk_applied(ctx, path, fpath, x, out);
                path.pop();
                fpath.pop();
            }
        }
        Shape::AssocList(keys) => {
            let items = v.as_array().cloned().unwrap_or_default();
            if items.is_empty() {
                out.insert(fpath);
            }
            for item in &items {
                fpath.push(item_key(item, &keys));
                path.push(ITEM.into());
                out.insert(fpath);
                walk_applied(ctx, path, fpath, item, out);
                path.pop();
                fpath.pop();
            }
        }
        Shape::SetList => {
            let items = v.as_array().cloned().unwrap_or_default();
            if items.is_empty() {
                out.insert(fpath);
            }
            for item in &items {
                fpath.push(PE::Value(serde_json::to_string(item).unwrap_or_default()));
                out.insert(fpath);
                fpath.pop();
            }
        }
        Shape::Scalar | Shape::AtomicMap | Shape::AtomicList => out.insert(fpath),
    }
}

/// The fields an update added or changed, as the Update operation of that manager owns them.
pub fn changed_set(ctx: ShapeCtx, old: Option<&Value>, new: &Value) -> FieldSet {
    let mut out = FieldSet::default();
    walk_changed(ctx, &mut Vec::new(), &mut Vec::new(), old, new, &mut out);
    out
}

fn walk_changed(
    ctx: ShapeCtx,
    path: &mut Vec<String>,
    fpath: &mut Vec<PE>,
    old: Option<&Value>,
    new: &Value,
    out: &mut FieldSet,
) {
    if old == Some(new) || new.is_null() {
        return;
    }
    let old = old.filter(|o| !o.is_null());
    match shape(ctx, path, new) {
        s @ (Shape::Struct | Shape::Map) => {
            let o = old.and_then(Value::as_object);
            let n = new.as_object().cloned().unwrap_or_default();
            let added = o.is_none() && !fpath.is_empty();
            if added && (s == Shape::Map || n.values().all(Value::is_null)) {
                out.insert(fpath);
            }
            for (k, x) in &n {
                path.push(k.clone());
                fpath.push(PE::Field(k.clone()));
                walk_changed(ctx, path, fpath, o.and_then(|o| o.get(k)), x, out);
                path.pop();
                fpath.pop();
            }
        }
        Shape::AssocList(keys) => {
            let o = old.and_then(Value::as_array);
            let items = new.as_array().cloned().unwrap_or_default();
            let required_list = path.last().map(String::as_str) == Some("containers");
            if o.is_none() && (!required_list || items.is_empty()) {
                out.insert(fpath);
            }
            for item in &items {
                let pe = item_key(item, &keys);
                let old_item = o.and_then(|a| a.iter().find(|i| pe.matches_item(i)));
                fpath.push(pe);
                path.push(ITEM.into());
                if old_item.is_none() {
                    out.insert(fpath);
                }
                walk_changed(ctx, path, fpath, old_item, item, out);
                path.pop();
                fpath.pop();
            }
        }
        Shape::SetList => {
            let o = old.and_then(Value::as_array);
            if o.is_none() {
                out.insert(fpath);
            }
            for item in new.as_array().into_iter().flatten() {
                if !o.is_some_and(|a| a.contains(item)) {
                    fpath.push(PE::Value(serde_json::to_string(item).unwrap_or_default()));
                    out.insert(fpath);
                    fpath.pop();
                }
            }
        }
        Shape::Scalar | Shape::AtomicMap | Shape::AtomicList => out.insert(fpath),
    }
}

/// Merges an applied configuration into the live object.
pub fn merge_applied(ctx: ShapeCtx, live: &mut Value, applied: &Value) {
    merge_at(ctx, &mut Vec::new(), live, applied);
}

fn merge_at(ctx: ShapeCtx, path: &mut Vec<String>, live: &mut Value, applied: &Value) {
    match shape(ctx, path, applied) {
        Shape::Struct | Shape::Map => {
            let Some(am) = applied.as_object() else {
                return;
            };
            if !live.is_object() {
                *live = Value::Object(Map::new());
            }
            let Value::Object(lm) = live else { return };
            for (k, v) in am {
                if v.is_null() {
                    lm.remove(k);
                    continue;
                }
                path.push(k.clone());
                match lm.get_mut(k) {
                    Some(l) => merge_at(ctx, path, l, v),
                    None => {
                        let mut fresh = Value::Null;
                        merge_at(ctx, path, &mut fresh, v);
                        lm.insert(k.clone(), fresh);
                    }
                }
                path.pop();
            }
        }
        Shape::AssocList(keys) => {
            let items = applied.as_array().cloned().unwrap_or_default();
            if !live.is_array() {
                *live = Value::Array(Vec::new());
            }
            let Value::Array(la) = live else { return };
            path.push(ITEM.into());
            for item in &items {
                let pe = item_key(item, &keys);
                match la.iter_mut().find(|i| pe.matches_item(i)) {
                    Some(l) => merge_at(ctx, path, l, item),
                    None => {
                        let mut fresh = Value::Null;
                        merge_at(ctx, path, &mut fresh, item);
                        la.push(fresh);
                    }
                }
            }
            path.pop();
        }
        Shape::SetList => {
            if !live.is_array() {
                *live = Value::Array(Vec::new());
            }
            let Value::Array(la) = live else { return };
            for item in applied.as_array().into_iter().flatten() {
                if !la.contains(item) {
                    la.push(item.clone());
                }
            }
        }
        Shape::Scalar | Shape::AtomicMap | Shape::AtomicList => {
            let mut v = applied.clone();
            super::util::strip_nulls(&mut v);
            *live = v;
        }
    }
}

/// One entry of metadata.managedFields.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: String,
    pub set: FieldSet,
}

impl Entry {
    /// Whether this entry is the one of (manager, operation, subresource): Update entries are
    /// also told apart by apiVersion.
    fn is(&self, manager: &str, operation: &str, api_version: &str, subresource: &str) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource == subresource
            && (operation == "Apply" || self.api_version == api_version)
    }

    /// How a conflict names this manager, as kube-apiserver's field manager prints its
    /// identifier (which has no time): `"m"`, `"m" with subresource "scale"`, then for an
    /// Update ` using apps/v1`.
    fn conflict_name(&self) -> String {
        let mut name = quote(&self.manager);
        if !self.subresource.is_empty() {
            name.push_str(&format!(" with subresource {}", quote(&self.subresource)));
        }
        if self.operation == "Update" {
            name.push_str(&format!(" using {}", self.api_version));
        }
        name
    }
}

pub fn read_entries(obj: &Value) -> Vec<Entry> {
    let list = obj
        .get("metadata")
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    list.iter()
        .map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            Entry {
                manager: s("manager"),
                operation: s("operation"),
                api_version: s("apiVersion"),
                time: s("time"),
                subresource: s("subresource"),
                set: FieldSet::from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null)),
            }
        })
        .collect()
}

pub fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.set.is_empty())
        .map(|e| {
            let mut m = Map::new();
            if !e.manager.is_empty() {
                m.insert("manager".into(), json!(e.manager));
            }
            m.insert("operation".into(), json!(e.operation));
            m.insert("apiVersion".into(), json!(e.api_version));
            m.insert("time".into(), json!(e.time));
            m.insert("fieldsType".into(), json!("FieldsV1"));
            m.insert("fieldsV1".into(), e.set.to_fields_v1());
            if !e.subresource.is_empty() {
                m.insert("subresource".into(), json!(e.subresource));
            }
            Value::Object(m)
        })
        .collect();
    let meta = super::util::meta_mut(obj);
    if list.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

/// Paths no manager owns: identity and bookkeeping the server sets itself.
fn strip(set: &mut FieldSet, subresource: &str, reset: &[Vec<PE>]) {
    for f in ["apiVersion", "kind"] {
        set.remove_tree(&[PE::Field(f.into())]);
    }
    for f in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "managedFields",
        "selfLink",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ] {
        set.remove_tree(&[PE::Field("metadata".into()), PE::Field(f.into())]);
    }
    set.remove(&[PE::Field("metadata".into())]);
    if subresource == "status" {
        let status = set.node(&[PE::Field("status".into())]).cloned();
        *set = FieldSet::default();
        if let Some(s) = status {
            set.children.insert(PE::Field("status".into()), s);
        }
    } else {
        for r in reset {
            set.remove_tree(r);
        }
    }
}

/// Who writes and how: the parts of a write that decide managed fields.
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    /// "" or "status".
    pub subresource: &'a str,
    /// Paths the main resource does not own (`status` when there is a status subresource).
    pub reset: Vec<Vec<PE>>,
    pub now: &'a str,
}

/// Records an Update by `w.manager` that turned `old` into `new` (whose managedFields are the
/// client's when it sent some, else the old ones).
pub fn record_update(ctx: ShapeCtx, w: &Writer, old: Option<&Value>, new: &mut Value) {
    let client_sent = new
        .get("metadata")
        .and_then(|m| m.get("managedFields"))
        .cloned();
    let old_entries = old.map(read_entries).unwrap_or_default();
    let mut entries = match client_sent {
        Some(Value::Array(a)) if a.is_empty() => Vec::new(),
        Some(Value::Array(_)) => read_entries(new),
        _ => old_entries,
    };
    let mut changed = changed_set(ctx, old, new);
    strip(&mut changed, w.subresource, &w.reset);
    for e in entries.iter_mut() {
        if !e.is(w.manager, "Update", w.api_version, w.subresource) {
            e.set.subtract(&changed);
        }
    }
    if !changed.is_empty() {
        match entries
            .iter_mut()
            .find(|e| e.is(w.manager, "Update", w.api_version, w.subresource))
        {
            Some(e) => {
                e.set.union(&changed);
                e.time = w.now.to_string();
            }
            None => entries.push(Entry {
                manager: w.manager.to_string(),
                operation: "Update".into(),
                api_version: w.api_version.to_string(),
                time: w.now.to_string(),
                subresource: w.subresource.to_string(),
                set: changed,
            }),
        }
    }
    write_entries(new, &entries);
}

/// A field another manager owns that an apply would change.
pub struct Conflict {
    pub manager: String,
    pub path: String,
}

/// Server-side apply of `applied` by `w.manager` onto `live` (None: create). Returns the merged
/// object with its managedFields, or the conflicts when not forced.
pub fn apply(
    ctx: ShapeCtx,
    w: &Writer,
    live: Option<&Value>,
    applied: &Value,
    force: bool,
) -> Result<Value, Vec<Conflict>> {
    let mut entries = live.map(read_entries).unwrap_or_default();
    let mut applied = applied.clone();
    if let Some(m) = applied.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in [
            "managedFields",
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "generation",
            "deletionTimestamp",
        ] {
            m.remove(k);
        }
    }
    let mut aset = applied_set(ctx, &applied);
    strip(&mut aset, w.subresource, &w.reset);
    // Only the owned part of the configuration is merged.
    if w.subresource == "status" {
        let status = applied.get("status").cloned();
        applied = json!({});
        if let Some(s) = status {
            applied["status"] = s;
        }
    } else if let Value::Object(m) = &mut applied {
        for r in &w.reset {
            if let [PE::Field(f)] = r.as_slice() {
                m.remove(f);
            }
        }
    }
    let mine = |e: &Entry| e.is(w.manager, "Apply", "", w.subresource);
    let mut conflicts = Vec::new();
    if let Some(live) = live {
        for p in aset.members() {
            if matches!(p.last(), Some(PE::Key(_) | PE::Value(_))) {
                continue;
            }
            let Some(lv) = get_path(live, &p) else {
                continue;
            };
            if Some(lv) == get_path(&applied, &p) {
                continue;
            }
            for e in entries.iter().filter(|e| !mine(e)) {
                if e.set.contains(&p) {
                    conflicts.push((e.conflict_name(), p.clone()));
                }
            }
        }
    }
    if !conflicts.is_empty() {
        if !force {
            return Err(conflicts
                .into_iter()
                .map(|(manager, p)| Conflict {
                    manager,
                    path: path_display(&p),
                })
                .collect());
        }
        for e in entries.iter_mut().filter(|e| !mine(e)) {
            for (_, p) in &conflicts {
                e.set.remove(p);
            }
        }
    }
    let mut merged = live.cloned().unwrap_or_else(|| json!({}));
    merge_applied(ctx, &mut merged, &applied);
    // Fields this manager applied before and no longer applies go, unless someone else has them.
    let previous = entries
        .iter()
        .find(|e| mine(e))
        .map(|e| e.set.clone())
        .unwrap_or_default();
    let mut others = FieldSet::default();
    for e in entries.iter().filter(|e| !mine(e)) {
        others.union(&e.set);
    }
    for p in previous.members() {
        if !aset.covers(&p) && !others.covers(&p) {
            remove_path(&mut merged, &p);
        }
    }
    let content_changed = {
        let mut a = merged.clone();
        let mut b = live.cloned().unwrap_or(Value::Null);
        for x in [&mut a, &mut b] {
            if let Some(m) = x.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("managedFields");
            }
        }
        a != b
    };
    match entries.iter_mut().find(|e| mine(e)) {
        Some(e) => {
            if e.set != aset || content_changed {
                e.time = w.now.to_string();
            }
            e.set = aset;
            e.api_version = w.api_version.to_string();
        }
        None => entries.push(Entry {
            manager: w.manager.to_string(),
            operation: "Apply".into(),
            api_version: w.api_version.to_string(),
            time: w.now.to_string(),
            subresource: w.subresource.to_string(),
            set: aset,
        }),
    }
    write_entries(&mut merged, &entries);
    Ok(merged)
}

/// Drops owned paths that no longer exist in `obj` (and entries left empty).
pub fn prune_entries(obj: &mut Value) {
    let mut entries = read_entries(obj);
    if entries.is_empty() {
        return;
    }
    for e in entries.iter_mut() {
        for p in e.set.members() {
            if !p.is_empty() && get_path(obj, &p).is_none() {
                e.set.remove_tree(&p);
            }
        }
    }
    write_entries(obj, &entries);
}

/// The conflict answer of an apply, as kube-apiserver words it.
pub fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [c] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            c.manager, c.path
        );
    }
    let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in conflicts {
        by_manager.entry(&c.manager).or_default().push(&c.path);
    }
    let mut lines = Vec::new();
    for (m, paths) in by_manager {
        lines.push(format!("conflicts with {m}:"));
        for p in paths {
            lines.push(format!("- {p}"));
        }
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}
