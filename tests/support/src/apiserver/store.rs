//! The server's state and what each verb does to it: one map of objects, one global
//! resourceVersion counter, a log of watch events, and the work kube-controller-manager would
//! do for namespaces, CustomResourceDefinitions, finalizers of the garbage collector.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use base64::Engine;
use serde_json::{Map, Value, json};

use super::RecordedRequest;
use super::aggregator;
use super::errors::{ApiError, FieldError, quote};
use super::fields::{self, PE, ShapeCtx, Writer};
use super::patch;
use super::pods;
use super::resources::{self, ResourceType};
use super::select::{FieldSelector, LabelSelector};
use super::typed::{self, DecodeError};
use super::util::{self, at, finalizers, meta_mut, meta_str, now_time, obj_mut, str_at};
use super::validation;

/// Where an object lives: storage group and resource, namespace ("" when cluster scoped), name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub group: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

/// One watch event as it happened.
#[derive(Debug, Clone)]
pub struct Change {
    pub rv: u64,
    pub key: Key,
    pub etype: &'static str,
    pub object: Value,
    pub old: Option<Value>,
}

/// A rule of `fail_next`.
#[derive(Debug, Clone)]
pub struct Failure {
    pub method: String,
    pub path_contains: String,
    pub status: u16,
    pub remaining: usize,
}

/// How many watch events are kept; older resourceVersions get 410 Gone.
const LOG_CAPACITY: usize = 100_000;

pub struct State {
    pub rv: u64,
    pub objects: BTreeMap<Key, Value>,
    pub log: VecDeque<Change>,
    /// Events at or below this resourceVersion are no longer in the log.
    pub floor: u64,
    /// Established custom resources by (group, plural).
    pub custom: BTreeMap<(String, String), ResourceType>,
    /// Groups of custom resources, in the order they appeared.
    pub custom_groups: Vec<String>,
    pub deleted_uids: HashSet<String>,
    /// Indexes the built-in controllers read instead of scanning every object after each write:
    /// the objects being deleted, the dependents of each owner uid, and the owners whose
    /// dependents are to be looked at by garbage collection.
    deleting: BTreeSet<Key>,
    dependents: HashMap<String, BTreeSet<Key>>,
    collect: BTreeSet<String>,
    pub requests: Vec<RecordedRequest>,
    pub failures: Vec<Failure>,
    /// RBAC's caches are empty (the first moments after a restart, apiserver/restart.rs).
    pub rbac_unsynced: bool,
    next_ip: u32,
    next_node_port: u32,
    /// Namespaces that may lack their `default` ServiceAccount (new ones, and those whose
    /// `default` was deleted), for the serviceaccount controller.
    accounts_due: BTreeSet<String>,
    /// An APIService or a Service changed, or an extension API server started or stopped:
    /// the availability of the APIServices is to be looked at again.
    pub apiservices_due: bool,
    /// The extension API servers that run.
    pub backends: aggregator::Backends,
    /// What containers wrote.
    pub logs: pods::Logs,
}

/// The answer of a write or a delete.
pub enum Out {
    /// An object (stored form) with its status code.
    Object(u16, Value),
    /// A Status or list, sent as is.
    Raw(u16, Value),
}

/// Who writes what, where.
pub struct Write<'a> {
    pub rt: &'a ResourceType,
    pub version: &'a str,
    pub namespace: &'a str,
    /// The name in the URL ("" for a create).
    pub name: &'a str,
    /// "" or "status".
    pub sub: &'a str,
    pub manager: &'a str,
    pub dry_run: bool,
    /// `fieldValidation=Strict` on a create, update or patch.
    pub strict: Strict,
}

/// `fieldValidation=Strict`: fields the kind does not have are refused instead of dropped,
/// worded as kube-apiserver words it for a body (create, update: 400) or for the result of a
/// patch (422). Server-side apply refuses them whatever the directive (`check_declared`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strict {
    #[default]
    No,
    Body,
    Patch,
}

enum Op {
    Create,
    Update,
    /// Server-side apply: managed fields already computed.
    Apply,
}

/// Options of a DELETE (query and DeleteOptions body).
#[derive(Debug, Default, Clone)]
pub struct DeleteOptions {
    pub propagation: Option<String>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

/// Selection of a list or watch.
#[derive(Debug, Default, Clone)]
pub struct Selection {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selection {
    pub fn matches(&self, presented: &Value) -> bool {
        self.labels.matches_object(presented) && self.fields.matches(presented)
    }
}

/// What a watch starts with.
pub struct WatchStart {
    pub initial: Vec<Value>,
    /// Events after this resourceVersion are streamed.
    pub from: u64,
}

fn internal_package(group: &str) -> &str {
    match group {
        "" | "events.k8s.io" => "core",
        g => g.split('.').next().unwrap_or(g),
    }
}

/// The form an object is shown in at `version` of `rt`.
pub fn present(rt: &ResourceType, version: &str, obj: &Value) -> Value {
    if rt.group == "events.k8s.io" {
        return typed::event_from_core(obj.clone());
    }
    if super::convert::is_hpa_v1(&rt.group, &rt.kind, version) {
        return super::convert::hpa_v2_to_v1(obj.clone());
    }
    let mut v = obj.clone();
    if rt.is_custom()
        && let Value::Object(m) = &mut v
    {
        m.insert("apiVersion".into(), json!(rt.api_version(version)));
    }
    v
}

/// An object as PartialObjectMetadata.
pub fn as_partial(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

fn is_deleting(obj: &Value) -> bool {
    at(obj, &["metadata", "deletionTimestamp"]).is_some_and(|v| !v.is_null())
}

fn uid_of(obj: &Value) -> String {
    meta_str(obj, "uid").unwrap_or("").to_string()
}

fn owner_uids(obj: &Value) -> Vec<String> {
    at(obj, &["metadata", "ownerReferences"])
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The object without what changes on every write, to tell whether a write changed anything.
fn comparable(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    v
}

/// The content that counts for metadata.generation.
fn generation_content(obj: &Value, without_status: bool) -> Value {
    let mut v = obj.clone();
    if let Value::Object(m) = &mut v {
        m.remove("metadata");
        if without_status {
            m.remove("status");
        }
    }
    v
}

impl State {
    pub fn new() -> State {
        let mut s = State {
            rv: 1,
            objects: BTreeMap::new(),
            log: VecDeque::new(),
            floor: 0,
            custom: BTreeMap::new(),
            custom_groups: Vec::new(),
            deleted_uids: HashSet::new(),
            deleting: BTreeSet::new(),
            dependents: HashMap::new(),
            collect: BTreeSet::new(),
            requests: Vec::new(),
            failures: Vec::new(),
            rbac_unsynced: false,
            next_ip: 1,
            next_node_port: 0,
            accounts_due: BTreeSet::new(),
            apiservices_due: false,
            backends: aggregator::Backends::new(),
            logs: pods::Logs::new(),
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let now = now_time();
            let obj = json!({
                "kind": "Namespace",
                "apiVersion": "v1",
                "metadata": {
                    "name": ns,
                    "uid": util::new_uid(),
                    "creationTimestamp": now,
                    "labels": {"kubernetes.io/metadata.name": ns},
                    "managedFields": [{
                        "manager": "kube-apiserver",
                        "operation": "Update",
                        "apiVersion": "v1",
                        "time": now,
                        "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:kubernetes.io/metadata.name": {}}}},
                    }],
                },
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            });
            let key = Key {
                group: String::new(),
                resource: "namespaces".into(),
                namespace: String::new(),
                name: ns.into(),
            };
            s.commit(key, obj);
        }
        s.reconcile();
        s
    }

    // ----- types -----

    pub fn find_type(&self, group: &str, version: &str, plural: &str) -> Option<ResourceType> {
        if let Some(rt) = resources::builtins().iter().find(|t| {
            t.group == group && t.plural == plural && t.versions.iter().any(|v| v == version)
        }) {
            return Some(rt.clone());
        }
        self.custom
            .get(&(group.to_string(), plural.to_string()))
            .filter(|t| t.versions.iter().any(|v| v == version))
            .cloned()
    }

    /// The type of `kind` at `api_version` ("v1", "apps/v1", ...).
    pub fn type_for_kind(&self, api_version: &str, kind: &str) -> Option<(ResourceType, String)> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let all = resources::builtins().iter().chain(self.custom.values());
        all.filter(|t| {
            t.group == group && t.kind == kind && t.versions.iter().any(|v| v == version)
        })
        .map(|t| (t.clone(), version.to_string()))
        .next()
    }

    /// Served group versions (group, versions preferred first), /apis order.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = resources::BUILTIN_GROUPS
            .iter()
            .map(|g| {
                let mut vs: Vec<String> = resources::builtins()
                    .iter()
                    .filter(|t| t.group == *g)
                    .flat_map(|t| t.versions.clone())
                    .collect();
                vs.dedup();
                (g.to_string(), vs)
            })
            .collect();
        for g in &self.custom_groups {
            let mut vs: Vec<String> = self
                .custom
                .values()
                .filter(|t| &t.group == g)
                .flat_map(|t| t.versions.clone())
                .collect();
            vs.sort_by_key(|v| typed::version_priority(v));
            vs.dedup();
            if !vs.is_empty() {
                out.push((g.clone(), vs));
            }
        }
        for r in aggregator::remotes(self) {
            match out.iter_mut().find(|(g, _)| *g == r.group) {
                Some((_, vs)) => {
                    if !vs.contains(&r.version) {
                        vs.push(r.version);
                    }
                }
                None => out.push((r.group, vec![r.version])),
            }
        }
        out
    }

    pub fn types_in(&self, group: &str, version: &str) -> Vec<ResourceType> {
        resources::builtins()
            .iter()
            .chain(self.custom.values())
            .filter(|t| t.group == group && t.versions.iter().any(|v| v == version))
            .cloned()
            .collect()
    }

    pub fn key(rt: &ResourceType, namespace: &str, name: &str) -> Key {
        Key {
            group: rt.storage_group.clone(),
            resource: rt.storage_resource.clone(),
            namespace: if rt.namespaced {
                namespace.to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }

    // ----- storage and events -----

    fn emit(&mut self, key: Key, etype: &'static str, object: Value, old: Option<Value>) {
        self.log.push_back(Change {
            rv: self.rv,
            key,
            etype,
            object,
            old,
        });
        while self.log.len() > LOG_CAPACITY {
            if let Some(c) = self.log.pop_front() {
                self.floor = c.rv;
            }
        }
    }

    /// Stores `obj` with the next resourceVersion and logs ADDED or MODIFIED.
    fn commit(&mut self, key: Key, mut obj: Value) -> Value {
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let old = self.objects.insert(key.clone(), obj.clone());
        if let Some(old) = &old {
            self.unindex(&key, old);
        }
        self.index(&key, &obj);
        self.note_change(&key, old.is_none());
        let etype = if old.is_some() { "MODIFIED" } else { "ADDED" };
        self.emit(key, etype, obj.clone(), old);
        obj
    }

    /// Removes the object; the DELETED event carries its last stored state at a new
    /// resourceVersion.
    fn remove(&mut self, key: &Key) -> Option<Value> {
        let mut last = self.objects.remove(key)?;
        self.unindex(key, &last);
        self.rv += 1;
        meta_mut(&mut last).insert("resourceVersion".into(), json!(self.rv.to_string()));
        self.deleted_uids.insert(uid_of(&last));
        self.collect.insert(uid_of(&last));
        self.note_change(key, false);
        if key.group.is_empty() && key.resource == "serviceaccounts" && key.name == "default" {
            self.accounts_due.insert(key.namespace.clone());
        }
        if key.group.is_empty() && key.resource == "pods" {
            let from = (key.namespace.clone(), key.name.clone(), String::new());
            let gone: Vec<_> = self
                .logs
                .range(from..)
                .take_while(|((ns, pod, _), _)| *ns == key.namespace && *pod == key.name)
                .map(|(k, _)| k.clone())
                .collect();
            for k in gone {
                self.logs.remove(&k);
            }
        }
        if key.group == "apiextensions.k8s.io"
            && let Some(rt) = typed::crd_type(&last)
        {
            self.custom.remove(&(rt.group, rt.plural));
        }
        self.emit(key.clone(), "DELETED", last.clone(), None);
        Some(last)
    }

    /// What the built-in controllers are to look at after a change of `key`.
    fn note_change(&mut self, key: &Key, added: bool) {
        if key.group.is_empty() && key.resource == "namespaces" && added {
            self.accounts_due.insert(key.name.clone());
        }
        if (key.group.is_empty() && key.resource == "services")
            || (key.group == "apiregistration.k8s.io" && key.resource == "apiservices")
        {
            self.apiservices_due = true;
        }
    }

    fn index(&mut self, key: &Key, obj: &Value) {
        if is_deleting(obj) {
            self.deleting.insert(key.clone());
        }
        let owners = owner_uids(obj);
        for owner in &owners {
            self.dependents
                .entry(owner.clone())
                .or_default()
                .insert(key.clone());
        }
        // Created with owners that are all gone already: garbage from the start.
        if !owners.is_empty() && owners.iter().all(|u| self.deleted_uids.contains(u)) {
            self.collect.extend(owners);
        }
    }

    fn unindex(&mut self, key: &Key, obj: &Value) {
        self.deleting.remove(key);
        for owner in owner_uids(obj) {
            if let Some(keys) = self.dependents.get_mut(&owner) {
                keys.remove(key);
                if keys.is_empty() {
                    self.dependents.remove(&owner);
                }
            }
        }
    }

    /// The objects being deleted that `f` picks.
    fn deleting_where(&self, f: impl Fn(&Key, &Value) -> bool) -> Vec<Key> {
        self.deleting
            .iter()
            .filter(|k| self.objects.get(*k).is_some_and(|v| f(k, v)))
            .cloned()
            .collect()
    }

    /// The objects that name `uid` among their owners.
    fn dependents_of(&self, uid: &str) -> Vec<Key> {
        self.dependents
            .get(uid)
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The stored objects of a storage group and resource, in one namespace or (None) all, in
    /// key order.
    pub fn of_resource<'a>(
        &'a self,
        group: &str,
        resource: &str,
        namespace: Option<&str>,
    ) -> impl Iterator<Item = (&'a Key, &'a Value)> + 'a {
        let from = Key {
            group: group.to_string(),
            resource: resource.to_string(),
            namespace: namespace.unwrap_or("").to_string(),
            name: String::new(),
        };
        let (group, resource) = (from.group.clone(), from.resource.clone());
        let namespace = namespace.map(str::to_string);
        self.objects.range(from..).take_while(move |(k, _)| {
            k.group == group
                && k.resource == resource
                && namespace.as_ref().is_none_or(|ns| k.namespace == *ns)
        })
    }

    /// Drops the watch history (as etcd compaction does): older resourceVersions get 410.
    pub fn compact(&mut self) {
        self.log.clear();
        self.floor = self.rv;
    }

    // ----- reads -----

    pub fn get(&self, rt: &ResourceType, namespace: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&Self::key(rt, namespace, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))
    }

    /// Objects of `rt` (in `namespace` unless "") in key order, presented at `version`.
    pub fn select(
        &self,
        rt: &ResourceType,
        version: &str,
        namespace: &str,
        sel: &Selection,
    ) -> Vec<(Key, Value)> {
        let namespace = (!namespace.is_empty()).then_some(namespace);
        self.of_resource(&rt.storage_group, &rt.storage_resource, namespace)
            .map(|(k, v)| (k.clone(), present(rt, version, v)))
            .filter(|(_, v)| sel.matches(v))
            .collect()
    }

    pub fn watch_start(
        &self,
        rt: &ResourceType,
        version: &str,
        namespace: &str,
        sel: &Selection,
        rv: Option<u64>,
        initial: bool,
    ) -> Result<WatchStart, ApiError> {
        match rv {
            Some(rv) if rv > 0 && !initial => {
                if rv < self.floor {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {rv} ({})",
                        self.floor
                    )));
                }
                Ok(WatchStart {
                    initial: Vec::new(),
                    from: rv,
                })
            }
            _ => Ok(WatchStart {
                initial: self
                    .select(rt, version, namespace, sel)
                    .into_iter()
                    .map(|(_, v)| v)
                    .collect(),
                from: self.rv,
            }),
        }
    }

    // ----- writes -----

    fn check_namespace(
        &self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
    ) -> Result<(), ApiError> {
        if !rt.namespaced {
            return Ok(());
        }
        let key = Key {
            group: String::new(),
            resource: "namespaces".into(),
            namespace: String::new(),
            name: namespace.into(),
        };
        match self.objects.get(&key) {
            None => Err(ApiError::not_found("", "namespaces", namespace)),
            Some(ns) if is_deleting(ns) => Err(ApiError::namespace_terminating(
                &rt.group, &rt.plural, name, namespace,
            )),
            Some(_) => Ok(()),
        }
    }

    /// The validating admission of a create that depends on other objects: a Pod's
    /// ServiceAccount must exist. A body that does not decode is left to fail decoding, as
    /// admission runs after it.
    fn admit(&self, w: &Write, body: &Value) -> Result<(), ApiError> {
        if !w.sub.is_empty() || !pods::admitted(&w.rt.group, &w.rt.kind) {
            return Ok(());
        }
        if let Err(DecodeError::BadRequest(_)) = typed::decode(w.rt, w.version, body.clone()) {
            return Ok(());
        }
        pods::admit(self, w.namespace, body)
    }

    /// A custom resource cannot be created while its definition is being deleted.
    fn check_definition(&self, rt: &ResourceType) -> Result<(), ApiError> {
        if !rt.is_custom() {
            return Ok(());
        }
        let key = Key {
            group: "apiextensions.k8s.io".into(),
            resource: "customresourcedefinitions".into(),
            namespace: String::new(),
            name: format!("{}.{}", rt.plural, rt.group),
        };
        if self.objects.get(&key).is_some_and(is_deleting) {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                "create not allowed while custom resource definition is terminating",
                Some(json!({})),
            ));
        }
        Ok(())
    }

    /// Checks apiVersion and kind of a body against the path (filling them in for built-ins).
    fn check_type_meta(w: &Write, obj: &mut Value) -> Result<(), ApiError> {
        let want = w.rt.api_version(w.version);
        let Value::Object(m) = obj else {
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {})",
                w.rt.kind
            )));
        };
        let av = m
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let kind = m
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if w.rt.is_custom() {
            if kind.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "Object 'Kind' is missing in '{}'",
                    Value::Object(m.clone())
                )));
            }
            let mut errs = Vec::new();
            if kind != w.rt.kind {
                errs.push(FieldError::invalid(
                    "kind",
                    &kind,
                    format!("must be {}", w.rt.kind),
                ));
            }
            if av != want {
                errs.push(FieldError::invalid(
                    "apiVersion",
                    &av,
                    format!("must be {want}"),
                ));
            }
            if !errs.is_empty() {
                let name = m
                    .get("metadata")
                    .and_then(|x| x.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or(w.name);
                return Err(ApiError::invalid(&w.rt.group, &w.rt.kind, name, &errs));
            }
            return Ok(());
        }
        if !kind.is_empty() && kind != w.rt.kind {
            let body_version = av.rsplit('/').next().unwrap_or(w.version).to_string();
            let body_version = if body_version.is_empty() {
                w.version.to_string()
            } else {
                body_version
            };
            return Err(ApiError::bad_request(format!(
                "{kind} in version {} cannot be handled as a {}: converting ({body_version}.{kind}) to ({}.{}): unknown conversion",
                super::errors::quote(&body_version),
                w.rt.kind,
                internal_package(&w.rt.group),
                w.rt.kind
            )));
        }
        if !av.is_empty() && av != want {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want})"
            )));
        }
        m.insert("apiVersion".into(), json!(want));
        m.insert("kind".into(), json!(w.rt.kind));
        Ok(())
    }

    fn writer<'a>(w: &'a Write, now: &'a str) -> Writer<'a> {
        let mut reset = Vec::new();
        if w.rt.status {
            reset.push(vec![PE::Field("status".into())]);
        }
        if w.rt.group.is_empty() && w.rt.kind == "Namespace" {
            reset.push(vec![
                PE::Field("spec".into()),
                PE::Field("finalizers".into()),
            ]);
        }
        Writer {
            manager: w.manager,
            api_version: if w.rt.group == "events.k8s.io" {
                "events.k8s.io/v1"
            } else {
                ""
            },
            subresource: w.sub,
            reset,
            now,
        }
    }

    fn shape_ctx<'a>(w: &'a Write) -> ShapeCtx<'a> {
        ShapeCtx {
            group: &w.rt.group,
            kind: &w.rt.kind,
            schema: w.rt.schemas.as_ref().and_then(|s| s.get(w.version)),
        }
    }

    /// The write pipeline: decode, default, record field ownership, apply the strategy,
    /// validate, store.
    fn write(
        &mut self,
        w: &Write,
        old: Option<Value>,
        mut obj: Value,
        op: Op,
    ) -> Result<Out, ApiError> {
        let rt = w.rt;
        let now = now_time();
        let api_version = rt.api_version(w.version);
        let name = meta_str(&obj, "name").unwrap_or(w.name).to_string();
        let raw = obj.clone();
        let decoded = match typed::decode(rt, w.version, obj) {
            Ok(v) => v,
            Err(DecodeError::BadRequest(m)) => return Err(ApiError::bad_request(m)),
            Err(DecodeError::Invalid(errs)) => {
                // A required field the typed form cannot do without: the server would decode
                // it and fail validation, so validate what was sent to say where.
                let mut found = Vec::new();
                if !rt.is_custom() {
                    validation::validate_meta(rt, &raw, &mut found);
                    validation::validate_kind(rt, &raw, old.as_ref(), &mut found);
                    if rt.group == "events.k8s.io" {
                        validation::validate_event(&raw, false, old.is_none(), &mut found);
                    }
                }
                let errs = if found.is_empty() { errs } else { found };
                return Err(ApiError::invalid(&rt.group, &rt.kind, &name, &errs));
            }
        };
        if !matches!(op, Op::Apply) {
            Self::check_strict(w, &raw, &decoded)?;
        }
        obj = decoded;
        if super::convert::is_hpa_v1(&rt.group, &rt.kind, w.version) {
            // Stored, and defaulted, as autoscaling/v2.
            obj = super::convert::hpa_v1_to_v2(obj);
        }
        typed::apply_defaults(rt, &mut obj);
        let mut errs = Vec::new();
        if rt.group == "events.k8s.io" {
            validation::validate_event(&obj, false, old.is_none(), &mut errs);
            obj = typed::event_to_core(obj);
        } else if rt.group.is_empty() && rt.kind == "Event" {
            validation::validate_event(
                &typed::event_from_core(obj.clone()),
                true,
                old.is_none(),
                &mut errs,
            );
        }
        let old_view = old.clone();
        if w.sub == "status"
            && let Some(old) = &old
        {
            // Through /status only the status changes.
            let mut next = old.clone();
            match obj.get("status") {
                Some(s) => next["status"] = s.clone(),
                None => {
                    if let Value::Object(m) = &mut next {
                        m.remove("status");
                    }
                }
            }
            if let Some(mf) = at(&obj, &["metadata", "managedFields"]).cloned() {
                meta_mut(&mut next).insert("managedFields".into(), mf);
            }
            obj = next;
        }
        if !matches!(op, Op::Apply) {
            if matches!(op, Op::Create)
                && let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut)
            {
                m.remove("managedFields");
            }
            let mut writer = Self::writer(w, &now);
            writer.api_version = &api_version;
            fields::record_update(Self::shape_ctx(w), &writer, old.as_ref(), &mut obj);
        }
        // Mutating admission, after the field manager: its changes are nobody's fields.
        if old.is_none() && w.sub.is_empty() && pods::admitted(&rt.group, &rt.kind) {
            pods::set_service_account(&mut obj);
        }
        match &old {
            None => self.prepare_create(rt, &mut obj, &now),
            Some(old) => self.prepare_update(rt, w.sub, old, &mut obj, &mut errs),
        }
        fields::prune_entries(&mut obj);
        validation::validate_meta(rt, &obj, &mut errs);
        if let Some(old) = &old {
            validation::validate_meta_update(&obj, old, &mut errs);
        }
        validation::validate_kind(rt, &obj, old.as_ref(), &mut errs);
        if let Some(schema) = rt.schemas.as_ref().and_then(|s| s.get(w.version)) {
            validation::validate_schema(schema, &obj, &mut errs);
            validation::validate_cel(schema, &obj, old.as_ref(), &mut errs);
        }
        if rt.group == "apiextensions.k8s.io" {
            errs.extend(typed::validate_crd(&obj));
            errs.extend(typed::validate_crd_stored_versions(&obj, old.is_none()));
        }
        if !errs.is_empty() {
            return Err(ApiError::invalid(&rt.group, &rt.kind, &name, &errs));
        }
        let key = Self::key(rt, w.namespace, &name);
        match old_view {
            None => {
                if w.dry_run {
                    return Ok(Out::Object(201, obj));
                }
                let stored = self.commit(key.clone(), obj);
                if rt.group == "apiextensions.k8s.io" {
                    self.establish(&key);
                }
                self.reconcile();
                Ok(Out::Object(201, stored))
            }
            Some(old) => {
                if comparable(&obj) == comparable(&old) {
                    return Ok(Out::Object(200, old));
                }
                if w.dry_run {
                    return Ok(Out::Object(200, obj));
                }
                if is_deleting(&old)
                    && finalizers(&obj).is_empty()
                    && !self.held_by_system(&key, &obj)
                {
                    self.remove(&key);
                    self.reconcile();
                    return Ok(Out::Object(200, obj));
                }
                let stored = self.commit(key.clone(), obj);
                if rt.group == "apiextensions.k8s.io" {
                    self.refresh_crd(&stored);
                }
                self.reconcile();
                Ok(Out::Object(200, stored))
            }
        }
    }

    /// Whether something other than metadata.finalizers keeps a deleted object (a namespace
    /// with content).
    fn held_by_system(&self, key: &Key, obj: &Value) -> bool {
        key.group.is_empty()
            && key.resource == "namespaces"
            && at(obj, &["spec", "finalizers"])
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
    }

    /// PrepareForCreate and BeforeCreate: what the server sets on a new object.
    fn prepare_create(&mut self, rt: &ResourceType, obj: &mut Value, now: &str) {
        let uid = util::new_uid();
        {
            let m = meta_mut(obj);
            m.insert("uid".into(), json!(uid));
            m.insert("creationTimestamp".into(), json!(now));
            for k in [
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
            ] {
                m.remove(k);
            }
            if rt.uses_generation() {
                m.insert("generation".into(), json!(1));
            } else {
                m.remove("generation");
            }
        }
        if rt.status
            && let Value::Object(m) = obj
        {
            m.remove("status");
        }
        self.prepare_common(rt, obj);
        let status = match (rt.group.as_str(), rt.kind.as_str()) {
            ("apps" | "batch" | "autoscaling" | "networking.k8s.io", _) if rt.status => {
                Some(json!({}))
            }
            ("policy", _) => Some(
                json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}),
            ),
            ("", "Service") => Some(json!({"loadBalancer": {}})),
            ("", "Pod") => Some(json!({"phase": "Pending", "qosClass": qos_class(obj)})),
            ("", "PersistentVolumeClaim") => Some(json!({"phase": "Pending"})),
            ("", "PersistentVolume") => Some(json!({"phase": "Pending"})),
            ("", "Namespace") => Some(json!({"phase": "Active"})),
            ("apiextensions.k8s.io", _) => {
                let storage: Vec<Value> = at(obj, &["spec", "versions"])
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                    .filter_map(|v| v.get("name").cloned())
                    .collect();
                Some(
                    json!({"acceptedNames": {"plural": "", "kind": ""}, "storedVersions": storage}),
                )
            }
            _ => None,
        };
        if let (Some(s), Value::Object(m)) = (status, &mut *obj) {
            m.insert("status".into(), s);
        }
        match (rt.group.as_str(), rt.kind.as_str()) {
            ("", "Namespace") => {
                obj_mut(obj, &["spec"]).insert("finalizers".into(), json!(["kubernetes"]));
            }
            ("batch", "Job") => {
                let name = meta_str(obj, "name").unwrap_or("").to_string();
                if at(obj, &["spec", "manualSelector"]).and_then(Value::as_bool) != Some(true) {
                    let labels = json!({
                        "batch.kubernetes.io/controller-uid": uid,
                        "batch.kubernetes.io/job-name": name,
                        "controller-uid": uid,
                        "job-name": name,
                    });
                    obj_mut(obj, &["spec"]).insert(
                        "selector".into(),
                        json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}),
                    );
                    let tl = obj_mut(obj, &["spec", "template", "metadata", "labels"]);
                    if let Value::Object(l) = labels {
                        tl.extend(l);
                    }
                }
            }
            ("", "Service") => {
                let spec = obj_mut(obj, &["spec"]);
                let type_ = spec
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("ClusterIP")
                    .to_string();
                if type_ != "ExternalName" {
                    let ip = match spec.get("clusterIP").and_then(Value::as_str) {
                        Some(ip) if !ip.is_empty() => ip.to_string(),
                        _ => {
                            let n = self.next_ip;
                            self.next_ip += 1;
                            format!("10.96.{}.{}", n / 250, n % 250 + 1)
                        }
                    };
                    spec.insert("clusterIP".into(), json!(ip));
                    spec.insert("clusterIPs".into(), json!([ip]));
                    spec.entry("ipFamilies").or_insert(json!(["IPv4"]));
                    spec.entry("ipFamilyPolicy").or_insert(json!("SingleStack"));
                }
                self.assign_node_ports(obj, None);
            }
            _ => {}
        }
    }

    /// Gives the ports of a NodePort or LoadBalancer service a node port: the one they had
    /// before, else the next free one from 30000.
    fn assign_node_ports(&mut self, svc: &mut Value, old: Option<&Value>) {
        let type_ = str_at(svc, &["spec", "type"])
            .unwrap_or("ClusterIP")
            .to_string();
        let Some(ports) = svc
            .get_mut("spec")
            .and_then(|s| s.get_mut("ports"))
            .and_then(Value::as_array_mut)
        else {
            return;
        };
        let needs = type_ == "NodePort" || type_ == "LoadBalancer";
        let old_ports: Vec<Value> = old
            .and_then(|o| at(o, &["spec", "ports"]))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            if !needs {
                p.remove("nodePort");
                continue;
            }
            if p.get("nodePort")
                .is_some_and(|n| n.as_i64().unwrap_or(0) != 0)
            {
                continue;
            }
            let before = old_ports
                .iter()
                .find(|o| o.get("port") == p.get("port") && o.get("protocol") == p.get("protocol"))
                .and_then(|o| o.get("nodePort"))
                .cloned();
            let port = before.unwrap_or_else(|| {
                self.next_node_port += 1;
                json!(30000 + (self.next_node_port % 2768))
            });
            p.insert("nodePort".into(), port);
        }
    }

    /// What create and update both do.
    fn prepare_common(&mut self, rt: &ResourceType, obj: &mut Value) {
        if rt.group.is_empty() && rt.kind == "Secret" {
            let string_data = obj.as_object_mut().and_then(|m| m.remove("stringData"));
            if let Some(Value::Object(sd)) = string_data {
                let data = obj_mut(obj, &["data"]);
                for (k, v) in sd {
                    let text = v.as_str().unwrap_or("").to_string();
                    data.insert(
                        k,
                        json!(base64::engine::general_purpose::STANDARD.encode(text)),
                    );
                }
            }
        }
    }

    /// PrepareForUpdate and BeforeUpdate: what the server keeps from the old object.
    fn prepare_update(
        &mut self,
        rt: &ResourceType,
        sub: &str,
        old: &Value,
        obj: &mut Value,
        errs: &mut Vec<FieldError>,
    ) {
        let old_meta = old
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        {
            let m = meta_mut(obj);
            let new_uid = m
                .get("uid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let old_uid = old_meta.get("uid").and_then(Value::as_str).unwrap_or("");
            if !new_uid.is_empty() && new_uid != old_uid {
                errs.push(FieldError::invalid(
                    "metadata.uid",
                    &new_uid,
                    "field is immutable",
                ));
            }
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match old_meta.get(k) {
                    Some(v) => m.insert(k.into(), v.clone()),
                    None => m.remove(k),
                };
            }
            m.remove("selfLink");
        }
        if rt.status
            && sub != "status"
            && let Value::Object(m) = obj
        {
            match old.get("status") {
                Some(s) => m.insert("status".into(), s.clone()),
                None => m.remove("status"),
            };
        }
        self.prepare_common(rt, obj);
        match (rt.group.as_str(), rt.kind.as_str()) {
            ("", "Namespace") => {
                if let (Value::Object(m), Some(spec)) = (&mut *obj, old.get("spec")) {
                    m.insert("spec".into(), spec.clone());
                }
            }
            ("apiextensions.k8s.io", _) => {
                // The storage version joins status.storedVersions.
                let storage = at(obj, &["spec", "versions"])
                    .and_then(Value::as_array)
                    .and_then(|vs| {
                        vs.iter()
                            .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                    })
                    .and_then(|v| v.get("name").cloned());
                if let Some(storage) = storage {
                    let status = obj_mut(obj, &["status"]);
                    let stored = status.entry("storedVersions").or_insert_with(|| json!([]));
                    if let Value::Array(list) = stored
                        && !list.contains(&storage)
                    {
                        list.push(storage);
                    }
                }
            }
            ("", "Service") => {
                let old_ip = str_at(old, &["spec", "clusterIP"]).map(String::from);
                let spec = obj_mut(obj, &["spec"]);
                if spec
                    .get("clusterIP")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
                    && let Some(ip) = old_ip
                {
                    spec.insert("clusterIP".into(), json!(ip));
                    spec.insert("clusterIPs".into(), json!([ip]));
                }
                for k in ["ipFamilies", "ipFamilyPolicy"] {
                    if spec.get(k).is_none()
                        && let Some(v) = at(old, &["spec", k])
                    {
                        spec.insert(k.into(), v.clone());
                    }
                }
                self.assign_node_ports(obj, Some(old));
            }
            _ => {}
        }
        if rt.uses_generation() && sub != "status" {
            let without_status = rt.status;
            if generation_content(obj, without_status) != generation_content(old, without_status) {
                let g = at(old, &["metadata", "generation"])
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                meta_mut(obj).insert("generation".into(), json!(g + 1));
            }
        }
    }

    /// POST
    pub fn create(&mut self, w: &Write, mut body: Value) -> Result<Out, ApiError> {
        Self::check_type_meta(w, &mut body)?;
        let m = meta_mut(&mut body);
        let body_ns = m
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if w.rt.namespaced {
            if !body_ns.is_empty() && body_ns != w.namespace {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            m.insert("namespace".into(), json!(w.namespace));
        } else {
            m.remove("namespace");
        }
        let mut name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let generate = m
            .get("generateName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let rv_set = m
            .get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty());
        if rv_set {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        self.check_definition(w.rt)?;
        // Admission sees the name asked for: a generated one comes after it. NamespaceLifecycle
        // refuses every create in a namespace being deleted, one without a name too.
        self.check_namespace(w.rt, w.namespace, &name)?;
        self.admit(w, &body)?;
        if name.is_empty() && !generate.is_empty() {
            name = format!("{generate}{}", util::random_suffix());
            meta_mut(&mut body).insert("name".into(), json!(name));
        }
        if !name.is_empty()
            && self
                .objects
                .contains_key(&Self::key(w.rt, w.namespace, &name))
        {
            return Err(ApiError::already_exists(&w.rt.group, &w.rt.plural, &name));
        }
        self.write(w, None, body, Op::Create)
    }

    /// PUT
    pub fn update(&mut self, w: &Write, mut body: Value) -> Result<Out, ApiError> {
        Self::check_type_meta(w, &mut body)?;
        self.check_name(w, &mut body)?;
        let key = Self::key(w.rt, w.namespace, w.name);
        let Some(old) = self.objects.get(&key).cloned() else {
            if w.rt.create_on_update() && w.sub.is_empty() {
                self.check_namespace(w.rt, w.namespace, w.name)?;
                if let Some(m) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                return self.write(w, None, body, Op::Create);
            }
            return Err(ApiError::not_found(&w.rt.group, &w.rt.plural, w.name));
        };
        // The body is decoded before the precondition is looked at.
        if let Err(DecodeError::BadRequest(m)) = typed::decode(w.rt, w.version, body.clone()) {
            return Err(ApiError::bad_request(m));
        }
        let rv = meta_str(&body, "resourceVersion").unwrap_or("").to_string();
        if rv.is_empty() {
            if !w.rt.unconditional_update() {
                return Err(ApiError::invalid(
                    &w.rt.group,
                    &w.rt.kind,
                    w.name,
                    &[FieldError::invalid_raw(
                        "metadata.resourceVersion",
                        "0x0",
                        "must be specified for an update",
                    )],
                ));
            }
        } else if rv != meta_str(&old, "resourceVersion").unwrap_or("") {
            return Err(ApiError::modified(&w.rt.group, &w.rt.plural, w.name));
        }
        self.write(w, Some(old), body, Op::Update)
    }

    /// The body's name (and namespace) against the URL.
    fn check_name(&self, w: &Write, body: &mut Value) -> Result<(), ApiError> {
        let m = meta_mut(body);
        let name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            m.insert("name".into(), json!(w.name));
        } else if name != w.name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({name}) does not match the name on the URL ({})",
                w.name
            )));
        }
        let ns = m
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if w.rt.namespaced {
            if !ns.is_empty() && ns != w.namespace {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            m.insert("namespace".into(), json!(w.namespace));
        } else {
            m.remove("namespace");
        }
        Ok(())
    }

    /// PATCH of every type but apply.
    pub fn patch(&mut self, w: &Write, content_type: &str, body: &Value) -> Result<Out, ApiError> {
        let key = Self::key(w.rt, w.namespace, w.name);
        let old = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&w.rt.group, &w.rt.plural, w.name))?;
        let mut doc = present(w.rt, w.version, &old);
        match content_type {
            "application/json-patch+json" => {
                patch::json_patch(&mut doc, body).map_err(|e| match e {
                    patch::PatchError::Decode(m) => ApiError::bad_request(m),
                    // NewGenericServerResponse(422, ...): the patch library's words are not kept.
                    patch::PatchError::Apply(_) => ApiError::new(
                        422,
                        "Invalid",
                        "the server rejected our request due to an error in our request",
                        Some(json!({})),
                    ),
                })?
            }
            "application/merge-patch+json" => {
                if !body.is_object() {
                    return Err(ApiError::bad_request(
                        "json: cannot unmarshal into Go value of type map[string]interface {}",
                    ));
                }
                patch::merge_patch(&mut doc, body)
            }
            _ => {
                if !body.is_object() {
                    return Err(ApiError::bad_request(
                        "json: cannot unmarshal into Go value of type map[string]interface {}",
                    ));
                }
                patch::strategic_merge_patch(Self::shape_ctx(w), &mut doc, body)
                    .map_err(ApiError::bad_request)?
            }
        }
        if !doc.is_object() {
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {})",
                w.rt.kind
            )));
        }
        let rv = meta_str(&doc, "resourceVersion").unwrap_or("").to_string();
        if rv != meta_str(&old, "resourceVersion").unwrap_or("") {
            return Err(ApiError::modified(&w.rt.group, &w.rt.plural, w.name));
        }
        Self::check_type_meta(w, &mut doc)?;
        self.check_name(w, &mut doc)?;
        self.write(w, Some(old), doc, Op::Update)
    }

    /// PATCH with application/apply-patch+yaml.
    pub fn apply(&mut self, w: &Write, mut body: Value, force: bool) -> Result<Out, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "error decoding YAML: the apply configuration must be an object",
            ));
        }
        if body
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            return Err(ApiError::bad_request(format!(
                "Object 'Kind' is missing in '{body}'"
            )));
        }
        if body
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            return Err(ApiError::bad_request(format!(
                "Object 'apiVersion' is missing in '{body}'"
            )));
        }
        Self::check_type_meta(w, &mut body)?;
        self.check_name(w, &mut body)?;
        let key = Self::key(w.rt, w.namespace, w.name);
        let old = self.objects.get(&key).cloned();
        if let Some(old) = &old {
            let rv = meta_str(&body, "resourceVersion").unwrap_or("");
            if !rv.is_empty() && rv != meta_str(old, "resourceVersion").unwrap_or("") {
                return Err(ApiError::modified(&w.rt.group, &w.rt.plural, w.name));
            }
        } else {
            if !w.sub.is_empty() {
                return Err(ApiError::not_found(&w.rt.group, &w.rt.plural, w.name));
            }
            self.check_definition(w.rt)?;
            self.check_namespace(w.rt, w.namespace, w.name)?;
            self.admit(w, &body)?;
        }
        let now = now_time();
        let api_version = w.rt.api_version(w.version);
        let mut writer = Self::writer(w, &now);
        writer.api_version = &api_version;
        let live = old.as_ref().map(|o| present(w.rt, w.version, o));
        let merged = fields::apply(Self::shape_ctx(w), &writer, live.as_ref(), &body, force).map_err(|conflicts| {
            let causes: Vec<Value> = conflicts
                .iter()
                .map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with {}", c.manager), "field": c.path}))
                .collect();
            ApiError::new(409, "Conflict", fields::conflict_message(&conflicts), Some(json!({"causes": causes})))
        })?;
        // A field the kind (or a custom resource's schema) does not have makes the apply fail
        // (structured-merge-diff's typed conversion) instead of being dropped, as a create or
        // an update drops it.
        {
            let mut probe = live.clone().unwrap_or_else(|| json!({}));
            fields::merge_applied(Self::shape_ctx(w), &mut probe, &body);
            self.check_declared(w, &body, &probe)?;
        }
        let mut merged = merged;
        if let Some(m) = merged.get_mut("metadata").and_then(Value::as_object_mut) {
            m.insert("name".into(), json!(w.name));
            if w.rt.namespaced {
                m.insert("namespace".into(), json!(w.namespace));
            }
        }
        merged["apiVersion"] = json!(api_version);
        merged["kind"] = json!(w.rt.kind);
        self.write(w, old, merged, Op::Apply)
    }

    /// `fieldValidation=Strict`: the fields of `raw` that decoding dropped are unknown, and
    /// refused with the strict decoding error of kube-apiserver (sigs.k8s.io/json's wording).
    /// A field sent as null is not told apart from an absent one (a known difference: Go's
    /// strict decoder names it too).
    fn check_strict(w: &Write, raw: &Value, decoded: &Value) -> Result<(), ApiError> {
        if w.strict == Strict::No {
            return Ok(());
        }
        let mut unknown = Vec::new();
        typed::unknown_fields(raw, decoded, "", &mut unknown);
        if unknown.is_empty() {
            return Ok(());
        }
        let errors: Vec<String> = unknown
            .iter()
            .map(|path| format!("unknown field {}", quote(path)))
            .collect();
        let strict = format!("strict decoding error: {}", errors.join(", "));
        Err(match w.strict {
            Strict::Patch => ApiError::invalid(
                "",
                "",
                "",
                &[FieldError::invalid("patch", &raw.to_string(), strict)],
            ),
            _ => ApiError::bad_request(format!(
                "{} in version {} cannot be handled as a {}: {strict}",
                w.rt.kind,
                quote(w.version),
                w.rt.kind
            )),
        })
    }

    fn check_declared(&self, w: &Write, applied: &Value, merged: &Value) -> Result<(), ApiError> {
        let decoded = match typed::decode(w.rt, w.version, merged.clone()) {
            Ok(v) => v,
            Err(_) => return Ok(()),
        };
        let set = fields::applied_set(Self::shape_ctx(w), applied);
        for p in set.members() {
            if p.is_empty() || fields::get_path(&decoded, &p).is_some() {
                continue;
            }
            // Only fields the decode dropped (not empty values it normalised away).
            let missing_parent = (0..p.len())
                .find(|i| fields::get_path(&decoded, &p[..=*i]).is_none())
                .unwrap_or(0);
            let shown = fields::path_display(&p[..=missing_parent]);
            let value = fields::get_path(applied, &p[..=missing_parent]);
            let empty = match value {
                Some(Value::Object(m)) => m.is_empty(),
                Some(Value::Array(a)) => a.is_empty(),
                Some(Value::String(s)) => s.is_empty(),
                Some(Value::Null) | None => true,
                _ => false,
            };
            if empty {
                continue;
            }
            let group = if w.rt.group.is_empty() {
                String::new()
            } else {
                w.rt.group.clone()
            };
            // kube-apiserver 1.36 answers 500, whatever `fieldValidation` says, naming the
            // object as `namespace/name` and its kind as Go prints a GroupVersionKind.
            return Err(ApiError::new(
                500,
                "",
                format!(
                    "failed to create typed patch object ({}/{}; {group}/{}, Kind={}): {shown}: field not declared in schema",
                    w.namespace, w.name, w.version, w.rt.kind
                ),
                None,
            ));
        }
        Ok(())
    }

    /// DELETE of one object.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Out, ApiError> {
        let key = Self::key(rt, namespace, name);
        let obj = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        if let Some(uid) = &opts.precondition_uid
            && *uid != uid_of(&obj)
        {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    uid_of(&obj)
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && rv != meta_str(&obj, "resourceVersion").unwrap_or("")
        {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!(
                    "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({}). The object might have been modified",
                    meta_str(&obj, "resourceVersion").unwrap_or("")
                ),
            ));
        }
        if is_deleting(&obj) {
            return Ok(Out::Object(200, obj));
        }
        let mut fins = finalizers(&obj);
        let mut add = |f: &str| {
            if !fins.iter().any(|x| x == f) {
                fins.push(f.to_string());
            }
        };
        match opts.propagation.as_deref() {
            Some("Foreground") => add("foregroundDeletion"),
            Some("Orphan") => add("orphan"),
            _ => {}
        }
        if rt.group == "apiextensions.k8s.io" {
            add("customresourcecleanup.apiextensions.k8s.io");
        }
        let namespace_kind = rt.group.is_empty() && rt.kind == "Namespace";
        if namespace_kind && matches!(name, "default" | "kube-system" | "kube-public") {
            return Err(ApiError::forbidden(
                "",
                "namespaces",
                name,
                "this namespace may not be deleted",
            ));
        }
        if fins.is_empty() && !namespace_kind {
            if opts.dry_run {
                return Ok(Out::Raw(200, success_status(rt, name, &uid_of(&obj))));
            }
            self.remove(&key);
            self.reconcile();
            return Ok(Out::Raw(200, success_status(rt, name, &uid_of(&obj))));
        }
        let mut next = obj.clone();
        {
            let m = meta_mut(&mut next);
            m.insert("deletionTimestamp".into(), json!(now_time()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            if !fins.is_empty() {
                m.insert("finalizers".into(), json!(fins));
            }
        }
        if namespace_kind {
            obj_mut(&mut next, &["status"]).insert("phase".into(), json!("Terminating"));
        }
        if rt.group == "apiextensions.k8s.io" {
            set_condition(
                &mut next,
                "Terminating",
                "True",
                "InstanceDeletionInProgress",
                "CustomResource deletion is in progress",
            );
        }
        fields::prune_entries(&mut next);
        if opts.dry_run {
            return Ok(Out::Object(200, next));
        }
        let stored = self.commit(key, next);
        self.reconcile();
        Ok(Out::Object(200, stored))
    }

    /// DELETE of a collection: deletes what the selection matches, answers the list.
    pub fn delete_collection(
        &mut self,
        rt: &ResourceType,
        version: &str,
        namespace: &str,
        sel: &Selection,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let matched = self.select(rt, version, namespace, sel);
        let mut items = Vec::new();
        for (key, _) in matched {
            match self.delete(rt, &key.namespace, &key.name, opts) {
                Ok(Out::Object(_, obj)) => items.push(present(rt, version, &obj)),
                Ok(Out::Raw(..)) => {
                    if let Some(last) = self.log.back() {
                        items.push(present(rt, version, &last.object));
                    }
                }
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(json!({
            "kind": format!("{}List", rt.kind),
            "apiVersion": rt.api_version(version),
            "metadata": {"resourceVersion": self.rv.to_string()},
            "items": items,
        }))
    }

    // ----- what controllers do -----

    /// Sets NamesAccepted and Established on a new CRD and starts serving its resource.
    fn establish(&mut self, key: &Key) {
        let Some(mut crd) = self.objects.get(key).cloned() else {
            return;
        };
        let Some(rt) = typed::crd_type(&crd) else {
            return;
        };
        let names = at(&crd, &["spec", "names"]).cloned().unwrap_or(json!({}));
        obj_mut(&mut crd, &["status"]).insert("acceptedNames".into(), names);
        set_condition(
            &mut crd,
            "NamesAccepted",
            "True",
            "NoConflicts",
            "no conflicts found",
        );
        set_condition(
            &mut crd,
            "Established",
            "True",
            "InitialNamesAccepted",
            "the initial names have been accepted",
        );
        if let Some(entries) = at(&crd, &["metadata", "managedFields"])
            .and_then(Value::as_array)
            .cloned()
        {
            let mut entries = entries;
            entries.push(json!({
                "manager": "kube-apiserver",
                "operation": "Update",
                "apiVersion": "apiextensions.k8s.io/v1",
                "time": now_time(),
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {"f:acceptedNames": {"f:kind": {}, "f:listKind": {}, "f:plural": {}, "f:singular": {}}, "f:conditions": {"k:{\"type\":\"Established\"}": {".": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}}, "k:{\"type\":\"NamesAccepted\"}": {".": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}}}}},
                "subresource": "status",
            }));
            meta_mut(&mut crd).insert("managedFields".into(), Value::Array(entries));
        }
        self.commit(key.clone(), crd);
        self.serve(rt);
    }

    fn serve(&mut self, rt: ResourceType) {
        if !self.custom_groups.contains(&rt.group) {
            self.custom_groups.push(rt.group.clone());
        }
        self.custom
            .insert((rt.group.clone(), rt.plural.clone()), rt);
    }

    fn refresh_crd(&mut self, crd: &Value) {
        if is_deleting(crd) {
            return;
        }
        let established = at(crd, &["status", "conditions"])
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.get("type") == Some(&json!("Established"))
                        && c.get("status") == Some(&json!("True"))
                })
            });
        if let Some(rt) = typed::crd_type(crd)
            && established
        {
            self.serve(rt);
        }
    }

    /// Runs the built-in controllers until nothing changes.
    pub fn reconcile(&mut self) {
        for _ in 0..1000 {
            if !self.controllers_step() {
                break;
            }
        }
    }

    fn keys_where(&self, f: impl Fn(&Key, &Value) -> bool) -> Vec<Key> {
        self.objects
            .iter()
            .filter(|(k, v)| f(k, v))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Deletes an object as a controller (background propagation).
    fn controller_delete(&mut self, key: &Key) {
        let Some(obj) = self.objects.get(key).cloned() else {
            return;
        };
        if is_deleting(&obj) {
            return;
        }
        if finalizers(&obj).is_empty() {
            self.remove(key);
        } else {
            let mut next = obj;
            let m = meta_mut(&mut next);
            m.insert("deletionTimestamp".into(), json!(now_time()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            self.commit(key.clone(), next);
        }
    }

    /// Removes one finalizer as its controller does; completes the deletion when none remain.
    fn drop_finalizer(&mut self, key: &Key, finalizer: &str) {
        let Some(mut obj) = self.objects.get(key).cloned() else {
            return;
        };
        let rest: Vec<String> = finalizers(&obj)
            .into_iter()
            .filter(|f| f != finalizer)
            .collect();
        if rest.is_empty() {
            meta_mut(&mut obj).remove("finalizers");
        } else {
            meta_mut(&mut obj).insert("finalizers".into(), json!(rest));
        }
        fields::prune_entries(&mut obj);
        if rest.is_empty() && is_deleting(&obj) && !self.held_by_system(key, &obj) {
            self.remove(key);
        } else {
            self.commit(key.clone(), obj);
        }
    }

    /// Removes all metadata.finalizers (a foreign controller done with the object).
    pub fn clear_finalizers(&mut self, key: &Key) -> bool {
        let Some(obj) = self.objects.get(key).cloned() else {
            return false;
        };
        let fins = finalizers(&obj);
        if fins.is_empty() {
            if is_deleting(&obj) && !self.held_by_system(key, &obj) {
                self.remove(key);
                self.reconcile();
            }
            return true;
        }
        let mut next = obj;
        meta_mut(&mut next).remove("finalizers");
        fields::prune_entries(&mut next);
        if is_deleting(&next) && !self.held_by_system(key, &next) {
            self.remove(key);
        } else {
            self.commit(key.clone(), next);
        }
        self.reconcile();
        true
    }

    /// Merges `status` into the object's status (the kubelet's or a controller's write).
    pub fn merge_status(&mut self, key: &Key, status: &Value) -> bool {
        let Some(mut obj) = self.objects.get(key).cloned() else {
            return false;
        };
        let mut current = obj.get("status").cloned().unwrap_or(json!({}));
        patch::merge_patch(&mut current, status);
        obj["status"] = current;
        self.commit(key.clone(), obj);
        true
    }

    fn controllers_step(&mut self) -> bool {
        // Namespaces being deleted: delete their content, then the namespace.
        let terminating =
            self.deleting_where(|k, _| k.group.is_empty() && k.resource == "namespaces");
        for ns_key in terminating {
            let content = self.keys_where(|k, v| k.namespace == ns_key.name && !is_deleting(v));
            if !content.is_empty() {
                for k in content {
                    self.controller_delete(&k);
                }
                return true;
            }
            if self.objects.keys().any(|k| k.namespace == ns_key.name) {
                continue;
            }
            let Some(mut ns) = self.objects.get(&ns_key).cloned() else {
                continue;
            };
            if let Some(spec) = ns.get_mut("spec").and_then(Value::as_object_mut) {
                spec.remove("finalizers");
            }
            if finalizers(&ns).is_empty() {
                self.remove(&ns_key);
            } else if at(&ns, &["spec", "finalizers"]).is_some()
                || self.objects.get(&ns_key) != Some(&ns)
            {
                self.commit(ns_key, ns);
            } else {
                continue;
            }
            return true;
        }
        // CustomResourceDefinitions being deleted: delete their objects, then the definition.
        let crds = self.deleting_where(|k, v| {
            k.group == "apiextensions.k8s.io"
                && finalizers(v)
                    .iter()
                    .any(|f| f == "customresourcecleanup.apiextensions.k8s.io")
        });
        for crd_key in crds {
            let Some(crd) = self.objects.get(&crd_key).cloned() else {
                continue;
            };
            let Some(rt) = typed::crd_type(&crd) else {
                continue;
            };
            let content = self.keys_where(|k, _| k.group == rt.group && k.resource == rt.plural);
            let pending: Vec<Key> = content
                .iter()
                .filter(|k| self.objects.get(*k).is_some_and(|v| !is_deleting(v)))
                .cloned()
                .collect();
            if !pending.is_empty() {
                for k in pending {
                    self.controller_delete(&k);
                }
                return true;
            }
            if content.is_empty() {
                self.drop_finalizer(&crd_key, "customresourcecleanup.apiextensions.k8s.io");
                return true;
            }
        }
        // Foreground deletion: dependents first.
        let foreground =
            self.deleting_where(|_, v| finalizers(v).iter().any(|f| f == "foregroundDeletion"));
        for key in foreground {
            let uid = self.objects.get(&key).map(uid_of).unwrap_or_default();
            let dependents = self.dependents_of(&uid);
            let live: Vec<Key> = dependents
                .iter()
                .filter(|k| self.objects.get(*k).is_some_and(|v| !is_deleting(v)))
                .cloned()
                .collect();
            if !live.is_empty() {
                for k in live {
                    self.controller_delete(&k);
                }
                return true;
            }
            if dependents.is_empty() {
                self.drop_finalizer(&key, "foregroundDeletion");
                return true;
            }
        }
        // Orphan: dependents lose the owner reference.
        let orphaning = self.deleting_where(|_, v| finalizers(v).iter().any(|f| f == "orphan"));
        if let Some(key) = orphaning.into_iter().next() {
            let uid = self.objects.get(&key).map(uid_of).unwrap_or_default();
            for dep in self.dependents_of(&uid) {
                if let Some(mut d) = self.objects.get(&dep).cloned() {
                    if let Some(Value::Array(refs)) = meta_mut(&mut d).get_mut("ownerReferences") {
                        refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid.as_str()));
                    }
                    if at(&d, &["metadata", "ownerReferences"])
                        .and_then(Value::as_array)
                        .is_some_and(Vec::is_empty)
                    {
                        meta_mut(&mut d).remove("ownerReferences");
                    }
                    fields::prune_entries(&mut d);
                    self.commit(dep, d);
                }
            }
            self.drop_finalizer(&key, "orphan");
            return true;
        }
        // Garbage collection: objects whose owners are all gone.
        let gone = std::mem::take(&mut self.collect);
        let mut orphans: Vec<Key> = gone
            .iter()
            .flat_map(|uid| self.dependents_of(uid))
            .filter(|k| {
                self.objects.get(k).is_some_and(|v| {
                    !is_deleting(v) && owner_uids(v).iter().all(|u| self.deleted_uids.contains(u))
                })
            })
            .collect();
        orphans.sort();
        orphans.dedup();
        if !orphans.is_empty() {
            for k in orphans {
                self.controller_delete(&k);
            }
            return true;
        }
        // The serviceaccount controller: every active namespace has a ServiceAccount `default`.
        let mut created = false;
        for namespace in std::mem::take(&mut self.accounts_due) {
            created |= self.ensure_default_account(&namespace);
        }
        if created {
            return true;
        }
        // The aggregator's availability controllers.
        std::mem::take(&mut self.apiservices_due) && self.refresh_apiservices()
    }

    /// Creates the ServiceAccount `default` in `namespace` if the namespace is active and has
    /// none, as kube-controller-manager does; whether it did.
    fn ensure_default_account(&mut self, namespace: &str) -> bool {
        let ns_key = Key {
            group: String::new(),
            resource: "namespaces".into(),
            namespace: String::new(),
            name: namespace.to_string(),
        };
        if self.objects.get(&ns_key).is_none_or(is_deleting) {
            return false;
        }
        let key = Key {
            group: String::new(),
            resource: "serviceaccounts".into(),
            namespace: namespace.to_string(),
            name: "default".into(),
        };
        if self.objects.contains_key(&key) {
            return false;
        }
        let account = json!({
            "kind": "ServiceAccount",
            "apiVersion": "v1",
            "metadata": {
                "name": "default",
                "namespace": namespace,
                "uid": util::new_uid(),
                "creationTimestamp": now_time(),
            },
        });
        self.commit(key, account);
        true
    }

    /// Writes each APIService's `Available` condition where it changed; whether any did.
    fn refresh_apiservices(&mut self) -> bool {
        let mut changed = Vec::new();
        for (key, obj) in self.of_resource("apiregistration.k8s.io", "apiservices", None) {
            let (available, reason, message) = aggregator::availability(self, obj);
            let mut next = obj.clone();
            aggregator::set_available(&mut next, available, reason, &message);
            if next != *obj {
                changed.push((key.clone(), next));
            }
        }
        let any = !changed.is_empty();
        for (key, next) in changed {
            self.commit(key, next);
        }
        any
    }
}

/// The QoS class of a pod: no requests or limits at all is BestEffort, limits equal to
/// requests for cpu and memory in every container is Guaranteed, else Burstable.
fn qos_class(pod: &Value) -> &'static str {
    let containers: Vec<&Value> = at(pod, &["spec", "containers"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    let res = |c: &Value, k: &str| {
        at(c, &["resources", k])
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    if containers
        .iter()
        .all(|c| res(c, "requests").is_empty() && res(c, "limits").is_empty())
    {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        let limits = res(c, "limits");
        let requests = res(c, "requests");
        ["cpu", "memory"].iter().all(|k| {
            limits.get(*k).is_some() && requests.get(*k).is_none_or(|r| Some(r) == limits.get(*k))
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

fn set_condition(obj: &mut Value, type_: &str, status: &str, reason: &str, message: &str) {
    let now = now_time();
    let s = obj_mut(obj, &["status"]);
    let conditions = s.entry("conditions").or_insert_with(|| json!([]));
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let Value::Array(list) = conditions else {
        return;
    };
    let cond = json!({"type": type_, "status": status, "lastTransitionTime": now, "reason": reason, "message": message});
    match list
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
    {
        Some(c) => *c = cond,
        None => list.push(cond),
    }
}

/// The Status a DELETE answers when the object is gone at once.
fn success_status(rt: &ResourceType, name: &str, uid: &str) -> Value {
    let mut details = Map::new();
    details.insert("name".into(), json!(name));
    if !rt.group.is_empty() {
        details.insert("group".into(), json!(rt.group));
    }
    details.insert("kind".into(), json!(rt.plural));
    details.insert("uid".into(), json!(uid));
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": Value::Object(details),
    })
}
