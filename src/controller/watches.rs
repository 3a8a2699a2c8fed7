//! What wakes a release besides its own object: metadata-only watches on every kind the
//! controller has applied (mapped back to the owning release through the `sequenced.dev/owner`
//! annotation), watches on the external objects werf charts depend on, and metadata-only
//! watches on the ConfigMaps and Secrets releases read (`valuesFrom`, a chart in
//! `configMapRef`/`secretRef`, `credentialsSecretRef`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::watcher;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::inputs::Inputs;
pub use super::inputs::{Input, InputKind};
use super::remotes::{Remotes, followed};
use crate::api::{
    OWNER_ANNOTATION, RELEASE_NAME_ANNOTATION, RELEASE_NAMESPACE_ANNOTATION, SequencedRelease,
    owner_of,
};
use crate::cluster::{Account, Cluster, Kind, reconnecting};
use crate::lock::Shards;
use crate::lock::shards::sharded_watches;

type Trigger = UnboundedSender<ObjectRef<SequencedRelease>>;

/// One watch of managed objects: a kind by API group and kind (the same objects whatever
/// version serves them), on a remote cluster (or the controller's), as an account sees it, in a
/// namespace or (None) the whole cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct WatchKey {
    remote: Option<Arc<str>>,
    account: Option<Account>,
    group: String,
    kind: String,
    namespace: Option<String>,
}
/// An object by namespace and name.
type ObjectName = (Option<String>, String);

/// The two watches of a kind: the objects of this replica's shards (label selector
/// `sequenced.dev/shard in (...)`, followed as the shards move), and the objects without a shard
/// label (objects of no release, and those applied before shards existed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Part {
    Shards,
    Unlabelled,
}

type IndexKey = (WatchKey, Part);

/// The objects of one kind that exist, each with what the index keeps of it ([`Seen`]).
#[derive(Default)]
struct Present {
    objects: HashMap<ObjectName, Seen>,
    /// The apiVersion the watch reads the kind at.
    api_version: String,
    /// The watch's first list is complete: an object not here does not exist.
    synced: bool,
}

/// What the index keeps of an object: the annotations that say whose it is and, while it is
/// being deleted, its deletionTimestamp and finalizers. Enough for [`crate::api::Claim::of`],
/// and for the readiness of kinds that are ready once they exist; kept small, as it is kept
/// for every object of every kind the controller writes. `mark` is a hash of what an edit of the
/// object changes ([`mark`]): a watch event whose mark differs from the one before is someone's
/// edit (or this controller's apply), and the owning release compares its objects in full.
#[derive(Debug, Clone, Default, PartialEq)]
struct Seen {
    annotations: Vec<(&'static str, Box<str>)>,
    deleting: Option<(Box<str>, Box<[String]>)>,
    mark: u64,
}

/// A hash of what an edit of an object changes, from its metadata alone: its generation (which
/// the API server moves on every change of its spec, not of its status) or, for kinds without
/// one (ConfigMaps, Secrets), its resourceVersion; and its labels and annotations.
fn mark(meta: &ObjectMeta) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    match meta.generation {
        Some(generation) => generation.hash(&mut hasher),
        None => meta.resource_version.hash(&mut hasher),
    }
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    hasher.finish()
}

impl Seen {
    fn of(object: &PartialObjectMeta<DynamicObject>) -> Seen {
        Seen::of_meta(&object.metadata)
    }

    fn of_meta(meta: &ObjectMeta) -> Seen {
        let annotations = [
            OWNER_ANNOTATION,
            RELEASE_NAME_ANNOTATION,
            RELEASE_NAMESPACE_ANNOTATION,
        ]
        .into_iter()
        .filter_map(|key| {
            let value = meta.annotations.as_ref()?.get(key)?;
            Some((key, value.as_str().into()))
        })
        .collect();
        let deleting = meta.deletion_timestamp.as_ref().map(|at| {
            let at = serde_json::to_value(at)
                .ok()
                .and_then(|v| v.as_str().map(Box::from))
                .unwrap_or_default();
            (
                at,
                meta.finalizers
                    .clone()
                    .unwrap_or_default()
                    .into_boxed_slice(),
            )
        });
        Seen {
            annotations,
            deleting,
            mark: mark(meta),
        }
    }

    /// The object as a metadata stub: apiVersion, kind, name, namespace, those annotations,
    /// and while it is being deleted its deletionTimestamp and finalizers.
    fn stub(&self, api_version: &str, kind: &str, name: &ObjectName) -> Value {
        let mut metadata = serde_json::Map::new();
        metadata.insert("name".into(), json!(name.1));
        if let Some(ns) = &name.0 {
            metadata.insert("namespace".into(), json!(ns));
        }
        if !self.annotations.is_empty() {
            let annotations: serde_json::Map<String, Value> = self
                .annotations
                .iter()
                .map(|(k, v)| ((*k).to_string(), json!(v)))
                .collect();
            metadata.insert("annotations".into(), Value::Object(annotations));
        }
        if let Some((at, finalizers)) = &self.deleting {
            metadata.insert("deletionTimestamp".into(), json!(at));
            metadata.insert("finalizers".into(), json!(finalizers));
        }
        json!({"apiVersion": api_version, "kind": kind, "metadata": metadata})
    }
}

/// An external object, by the cluster and account watching it, kind, namespace and name.
type ExternalKey = (
    Option<Arc<str>>,
    Option<Account>,
    String,
    String,
    Option<String>,
    String,
);

/// The watch whose index holds the objects of this group and kind in `namespace`, as
/// `cluster`'s account sees them: the one over the cluster when there is one, else the
/// namespace's.
fn index_key(
    present: &HashMap<IndexKey, Present>,
    cluster: &Cluster,
    group: &str,
    kind: &str,
    namespace: Option<&str>,
) -> WatchKey {
    let mut key = WatchKey {
        remote: cluster.remote_id().cloned(),
        account: cluster.account().cloned(),
        group: group.to_string(),
        kind: kind.to_string(),
        namespace: None,
    };
    if !present.contains_key(&(key.clone(), Part::Shards)) {
        key.namespace = namespace.map(str::to_string);
    }
    key
}

/// The set of running watches; each is started once and runs until the controller stops.
pub struct Watches {
    trigger: Trigger,
    kinds: Mutex<HashSet<WatchKey>>,
    /// The managed objects that exist, by watch, as the managed watches last saw them.
    present: Arc<Mutex<HashMap<IndexKey, Present>>>,
    /// This replica's shards: the managed watches ask for their objects.
    shards: Arc<Shards>,
    /// The releases one of whose objects changed (its [`Seen::mark`]) or went since they last
    /// compared them in full ([`Watches::take_changed`]).
    changed: Arc<Mutex<HashSet<ObjectRef<SequencedRelease>>>>,
    external: Arc<Mutex<HashMap<ExternalKey, HashSet<ObjectRef<SequencedRelease>>>>>,
    /// The ConfigMaps and Secrets releases read.
    inputs: Inputs,
    /// The watch tasks, stopped when the controller goes away; those of a remote cluster by
    /// its id too, stopped when no release targets it any more.
    tasks: Mutex<Vec<(Option<Arc<str>>, tokio::task::AbortHandle)>>,
    remotes: Arc<Remotes>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        if let Ok(tasks) = self.tasks.get_mut() {
            for (_, task) in tasks.drain(..) {
                task.abort();
            }
        }
    }
}

impl Watches {
    pub fn new(client: Client, trigger: Trigger, shards: Arc<Shards>) -> Watches {
        let remotes = Arc::new(Remotes::default());
        remotes.wake_with(trigger.clone());
        Watches {
            remotes,
            inputs: Inputs::new(client, Arc::clone(shards.health()), trigger.clone()),
            trigger,
            shards,
            kinds: Mutex::new(HashSet::new()),
            present: Arc::new(Mutex::new(HashMap::new())),
            changed: Arc::new(Mutex::new(HashSet::new())),
            external: Arc::new(Mutex::new(HashMap::new())),
            tasks: Mutex::new(Vec::new()),
        }
    }

    fn keep_for(&self, remote: Option<&Arc<str>>, task: tokio::task::JoinHandle<()>) {
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.push((remote.cloned(), task.abort_handle()));
        }
    }

    /// The remote clusters releases target, whose watches these are.
    pub(crate) fn remotes(&self) -> &Arc<Remotes> {
        &self.remotes
    }

    /// No release targets the remote cluster `id` any more: its watches stop, and what they
    /// kept goes.
    pub fn forget_remote(&self, id: &Arc<str>) {
        let ours = |remote: &Option<Arc<str>>| remote.as_ref() == Some(id);
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.retain(|(remote, task)| {
                if ours(remote) {
                    task.abort();
                }
                !ours(remote)
            });
        }
        if let Ok(mut kinds) = self.kinds.lock() {
            kinds.retain(|k| !ours(&k.remote));
        }
        if let Ok(mut present) = self.present.lock() {
            present.retain(|(k, _), _| !ours(&k.remote));
        }
        if let Ok(mut external) = self.external.lock() {
            external.retain(|k, _| !ours(&k.0));
        }
    }

    /// Watches the metadata of every object of `kind` that the controller manages, as
    /// `cluster`'s account sees them: over the whole cluster for the controller's own identity,
    /// in `namespace` for a service account (which may have rights in its namespaces only).
    pub fn managed(&self, kind: &Kind, cluster: &Cluster, namespace: Option<&str>) {
        // A remote cluster's kubeconfig may have rights in some namespaces only, as an account.
        let narrow = cluster.account().is_some() || cluster.remote_id().is_some();
        let key = WatchKey {
            remote: cluster.remote_id().cloned(),
            account: cluster.account().cloned(),
            group: kind.resource.group.clone(),
            kind: kind.resource.kind.clone(),
            namespace: namespace
                .filter(|_| kind.namespaced && narrow)
                .map(str::to_string),
        };
        {
            let Ok(mut kinds) = self.kinds.lock() else {
                return;
            };
            if !kinds.insert(key.clone()) {
                return;
            }
        }
        let api: Api<PartialObjectMeta<DynamicObject>> = match &key.namespace {
            Some(ns) => Api::namespaced_with(cluster.client().clone(), ns, &kind.resource),
            None => Api::all_with(cluster.client().clone(), &kind.resource),
        };
        // Every object of the kind in this replica's shards, and every object of no shard (not
        // only the managed ones): whether an object this release is about to write exists, and
        // whose it is, is then known without reading it, unless it may be of another shard.
        let what = format!(
            "{}/{}{}",
            kind.resource.api_version,
            kind.resource.kind,
            key.account
                .as_ref()
                .map(|a| format!(" as {a}"))
                .unwrap_or_default()
        );
        let [sharded, unlabelled] =
            sharded_watches(api, "", self.shards.watch(), self.shards.health());
        for (part, events) in [(Part::Shards, sharded), (Part::Unlabelled, unlabelled)] {
            let events = followed(&self.remotes, cluster, events);
            let task = self.index(
                (key.clone(), part),
                events,
                kind.resource.api_version.clone(),
                what.clone(),
            );
            self.keep_for(key.remote.as_ref(), task);
        }
    }

    /// Keeps the index of one watch of managed objects, and wakes the owners of the objects
    /// that change.
    fn index(
        &self,
        key: IndexKey,
        events: futures::stream::BoxStream<
            'static,
            Result<Event<PartialObjectMeta<DynamicObject>>, watcher::Error>,
        >,
        api_version: String,
        what: String,
    ) -> tokio::task::JoinHandle<()> {
        let trigger = self.trigger.clone();
        let present = Arc::clone(&self.present);
        let changed = Arc::clone(&self.changed);
        tokio::spawn(async move {
            tracing::debug!(kind = %what, part = ?key.1, "watching managed objects");
            let mut events = events;
            // The objects of a (re)list, swapped in once it is complete.
            let mut listing: HashMap<ObjectName, Seen> = HashMap::new();
            while let Some(event) = events.next().await {
                let name = |o: &PartialObjectMeta<DynamicObject>| (o.namespace(), o.name_any());
                // Whether the object differs from what the index had of it (an edit, or this
                // controller's apply not yet learnt from its answer), or went.
                let differs = |n: &ObjectName, seen: Option<&Seen>| {
                    let Ok(present) = present.lock() else {
                        return false;
                    };
                    let before = present.get(&key).and_then(|p| p.objects.get(n));
                    match (before, seen) {
                        (Some(before), Some(seen)) => before.mark != seen.mark,
                        (Some(_), None) => true,
                        (None, _) => false,
                    }
                };
                let object = match event {
                    Ok(Event::Init) => {
                        listing.clear();
                        continue;
                    }
                    Ok(Event::InitDone) => {
                        let mut listed = Some(std::mem::take(&mut listing));
                        if let Ok(mut present) = present.lock() {
                            let p = present.entry(key.clone()).or_default();
                            p.objects = listed.take().unwrap_or_default();
                            p.api_version.clone_from(&api_version);
                            p.synced = true;
                        }
                        continue;
                    }
                    Ok(Event::InitApply(o)) => {
                        // A relist after the watch was away: what changed meanwhile.
                        let (n, seen) = (name(&o), Seen::of(&o));
                        let edited = differs(&n, Some(&seen));
                        listing.insert(n, seen);
                        (o, edited)
                    }
                    Ok(Event::Apply(o)) => {
                        let (n, seen) = (name(&o), Seen::of(&o));
                        let edited = differs(&n, Some(&seen));
                        if let Ok(mut present) = present.lock() {
                            present
                                .entry(key.clone())
                                .or_default()
                                .objects
                                .insert(n, seen);
                        }
                        (o, edited)
                    }
                    Ok(Event::Delete(o)) => {
                        let n = name(&o);
                        if let Ok(mut present) = present.lock() {
                            present.entry(key.clone()).or_default().objects.remove(&n);
                        }
                        (o, true)
                    }
                    Err(e) => {
                        tracing::debug!(kind = %what, error = %e, "watch error");
                        continue;
                    }
                };
                let (object, edited) = object;
                let Some(owner) = owner_of(object.annotations()) else {
                    continue;
                };
                if edited && let Ok(mut changed) = changed.lock() {
                    changed.insert(owner.clone());
                }
                if trigger.unbounded_send(owner).is_err() {
                    return;
                }
            }
        })
    }

    /// Whether one of the release's objects changed or went, as the managed watches saw it,
    /// since the last call (which forgets it): its objects are then compared in full with what
    /// it applied. A release none of whose objects changed sends nothing to find drift.
    pub fn take_changed(&self, release: &ObjectRef<SequencedRelease>) -> bool {
        self.changed
            .lock()
            .map(|mut changed| changed.remove(release))
            .unwrap_or(true)
    }

    /// Says again that one of the release's objects changed: the full comparison that
    /// [`Watches::take_changed`] called for failed, and the next reconcile tries it again.
    pub fn mark_changed(&self, release: &ObjectRef<SequencedRelease>) {
        if let Ok(mut changed) = self.changed.lock() {
            changed.insert(release.clone());
        }
    }

    /// Forgets a release that is gone.
    pub fn forget_changed(&self, release: &ObjectRef<SequencedRelease>) {
        if let Ok(mut changed) = self.changed.lock() {
            changed.remove(release);
        }
    }

    /// Whether an object of this group and kind exists, as the watch of `cluster`'s account
    /// last saw it; None while the kind is not watched or its first list is not complete.
    pub fn exists(
        &self,
        cluster: &Cluster,
        group: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<bool> {
        self.seen(cluster, group, kind, namespace, name, |seen, _, _| {
            seen.is_some()
        })
    }

    /// The object as the watch of `cluster`'s account last saw it, as a metadata stub
    /// ([`Seen::stub`]): `Some(None)` when it does not exist, None while the kind is not watched or
    /// its first list is not complete.
    pub fn lookup(
        &self,
        cluster: &Cluster,
        group: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Option<Value>> {
        self.seen(
            cluster,
            group,
            kind,
            namespace,
            name,
            |seen, api_version, name| seen.map(|seen| seen.stub(api_version, kind, name)),
        )
    }

    /// This controller just applied the object and the API server answered with `meta`: the
    /// index knows it from now on, before the watch's event for it arrives (a wake in between
    /// would otherwise find the object missing). The watch's events overwrite it as usual.
    pub fn applied(
        &self,
        cluster: &Cluster,
        kind: &Kind,
        namespace: Option<&str>,
        meta: &ObjectMeta,
    ) {
        let Some(name) = meta.name.clone() else {
            return;
        };
        let Ok(mut present) = self.present.lock() else {
            return;
        };
        let (group, kind_name) = (&kind.resource.group, &kind.resource.kind);
        let key = index_key(&present, cluster, group, kind_name, namespace);
        if let Some(index) = present
            .get_mut(&(key, Part::Shards))
            .filter(|index| index.synced)
        {
            let namespace = namespace.filter(|_| kind.namespaced).map(str::to_string);
            index.objects.insert((namespace, name), Seen::of_meta(meta));
        }
    }

    /// `answer` applied to what the index of `cluster`'s account keeps of the object (None when
    /// it does not exist), the kind's apiVersion and the object's name; None while the kind is
    /// not watched or its first list is not complete.
    fn seen<T>(
        &self,
        cluster: &Cluster,
        group: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        answer: impl FnOnce(Option<&Seen>, &str, &ObjectName) -> T,
    ) -> Option<T> {
        let present = self.present.lock().ok()?;
        let key = index_key(&present, cluster, group, kind, namespace);
        let sharded = present.get(&(key.clone(), Part::Shards))?;
        let unlabelled = present.get(&(key, Part::Unlabelled))?;
        if !(sharded.synced && unlabelled.synced) {
            return None;
        }
        let name = (namespace.map(str::to_string), name.to_string());
        let found = sharded
            .objects
            .get(&name)
            .or_else(|| unlabelled.objects.get(&name));
        // Not seen: it does not exist, unless it is an object of a shard this replica does not
        // watch (another release's); only a replica that owns every shard can tell.
        if found.is_none() && !self.shards.owns_all() {
            return None;
        }
        let api_version = if sharded.api_version.is_empty() {
            &unlabelled.api_version
        } else {
            &sharded.api_version
        };
        Some(answer(found, api_version, &name))
    }

    /// Wakes `owner` when an object of its `dependsOn` changes, watched as `cluster`'s
    /// account: the object becoming ready starts the release at once.
    pub fn dependency(
        &self,
        cluster: &Cluster,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
        owner: ObjectRef<SequencedRelease>,
    ) {
        self.external(cluster, kind, namespace, name, owner);
    }

    /// Wakes `owner` when the external object changes (werf's external dependencies), watched
    /// as `cluster`'s account.
    pub fn external(
        &self,
        cluster: &Cluster,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
        owner: ObjectRef<SequencedRelease>,
    ) {
        let key: ExternalKey = (
            cluster.remote_id().cloned(),
            cluster.account().cloned(),
            kind.resource.api_version.clone(),
            kind.resource.kind.clone(),
            namespace.map(str::to_string),
            name.to_string(),
        );
        {
            let Ok(mut external) = self.external.lock() else {
                return;
            };
            let owners = external.entry(key.clone()).or_default();
            let first = owners.is_empty();
            owners.insert(owner);
            if !first {
                return;
            }
        }
        let client = cluster.client().clone();
        let api: Api<PartialObjectMeta<DynamicObject>> = match namespace {
            Some(ns) if kind.namespaced => Api::namespaced_with(client, ns, &kind.resource),
            _ => Api::all_with(client, &kind.resource),
        };
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let trigger = self.trigger.clone();
        let registry = Arc::clone(&self.external);
        let remote = key.0.clone();
        let health = Arc::clone(cluster.health());
        let events = reconnecting(watcher(api, config).boxed(), &health);
        let events = followed(&self.remotes, cluster, events);
        let task = tokio::spawn(async move {
            let mut events = events;
            while let Some(event) = events.next().await {
                if !matches!(
                    event,
                    Ok(Event::Apply(_) | Event::InitApply(_) | Event::Delete(_))
                ) {
                    continue;
                }
                let owners: Vec<_> = match registry.lock() {
                    Ok(map) => map.get(&key).into_iter().flatten().cloned().collect(),
                    Err(_) => return,
                };
                for owner in owners {
                    if trigger.unbounded_send(owner).is_err() {
                        return;
                    }
                }
            }
        });
        self.keep_for(remote.as_ref(), task);
    }

    /// Records that `release` reads `inputs` (and nothing else), and wakes it whenever one of
    /// them is created, changed or deleted ([`Inputs::reads`]).
    pub fn reads(&self, release: &ObjectRef<SequencedRelease>, inputs: HashSet<Input>) {
        self.inputs.reads(release, inputs);
    }

    /// Forgets what a release that is gone read.
    pub fn forget_reads(&self, release: &ObjectRef<SequencedRelease>) {
        self.inputs.forget_reads(release);
    }

    /// How many changes of `input` its watch has seen; None before it saw the input.
    pub fn input_version(&self, input: &Input) -> Option<u64> {
        self.inputs.version(input)
    }
}
