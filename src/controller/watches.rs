//! What wakes a release besides its own object: metadata-only watches on every kind the
//! controller has applied (mapped back to the owning release through the `sequenced.dev/owner`
//! annotation), watches on the external objects werf charts depend on, and metadata-only
//! watches on the ConfigMaps and Secrets releases read (`valuesFrom`, a chart in
//! `configMapRef`/`secretRef`, `credentialsSecretRef`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher::watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::api::{
    OWNER_ANNOTATION, RELEASE_NAME_ANNOTATION, RELEASE_NAMESPACE_ANNOTATION, SequencedRelease,
    owner_of,
};
use crate::cluster::{Account, Cluster, Kind};
use crate::lock::Shards;
use crate::lock::shards::sharded_watches;

type Trigger = UnboundedSender<ObjectRef<SequencedRelease>>;

/// One watch of managed objects: a kind by API group and kind (the same objects whatever
/// version serves them), as an account sees it, in a namespace or (None) the whole cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct WatchKey {
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
/// for every object of every kind the controller writes.
#[derive(Debug, Clone, Default, PartialEq)]
struct Seen {
    annotations: Vec<(&'static str, Box<str>)>,
    deleting: Option<(Box<str>, Box<[String]>)>,
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

/// An external object, by the account watching it, kind, namespace and name.
type ExternalKey = (Option<Account>, String, String, Option<String>, String);

/// A ConfigMap or Secret a release reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InputKind {
    ConfigMap,
    Secret,
}

/// An input by kind, namespace and name.
pub type Input = (InputKind, String, String);

/// Which releases read which inputs, both ways.
#[derive(Default)]
struct Readers {
    of: HashMap<Input, HashSet<ObjectRef<SequencedRelease>>>,
    reads: HashMap<ObjectRef<SequencedRelease>, HashSet<Input>>,
}

impl Readers {
    /// Makes `inputs` all that `release` reads.
    fn set(&mut self, release: &ObjectRef<SequencedRelease>, inputs: HashSet<Input>) {
        for old in self.reads.remove(release).unwrap_or_default() {
            if let Some(readers) = self.of.get_mut(&old) {
                readers.remove(release);
                if readers.is_empty() {
                    self.of.remove(&old);
                }
            }
        }
        for input in &inputs {
            self.of
                .entry(input.clone())
                .or_default()
                .insert(release.clone());
        }
        if !inputs.is_empty() {
            self.reads.insert(release.clone(), inputs);
        }
    }
}

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
    client: Client,
    trigger: Trigger,
    kinds: Mutex<HashSet<WatchKey>>,
    /// The managed objects that exist, by watch, as the managed watches last saw them.
    present: Arc<Mutex<HashMap<IndexKey, Present>>>,
    /// This replica's shards: the managed watches ask for their objects.
    shards: Arc<Shards>,
    external: Arc<Mutex<HashMap<ExternalKey, HashSet<ObjectRef<SequencedRelease>>>>>,
    readers: Arc<Mutex<Readers>>,
    /// The input watches started, by kind and namespace.
    input_watches: Mutex<HashSet<(InputKind, String)>>,
    /// The watch tasks, stopped when the controller goes away.
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        if let Ok(tasks) = self.tasks.get_mut() {
            for task in tasks.drain(..) {
                task.abort();
            }
        }
    }
}

impl Watches {
    pub fn new(client: Client, trigger: Trigger, shards: Arc<Shards>) -> Watches {
        Watches {
            client,
            trigger,
            shards,
            kinds: Mutex::new(HashSet::new()),
            present: Arc::new(Mutex::new(HashMap::new())),
            external: Arc::new(Mutex::new(HashMap::new())),
            readers: Arc::new(Mutex::new(Readers::default())),
            input_watches: Mutex::new(HashSet::new()),
            tasks: Mutex::new(Vec::new()),
        }
    }

    fn keep(&self, task: tokio::task::JoinHandle<()>) {
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.push(task.abort_handle());
        }
    }

    /// Watches the metadata of every object of `kind` that the controller manages, as
    /// `cluster`'s account sees them: over the whole cluster for the controller's own identity,
    /// in `namespace` for a service account (which may have rights in its namespaces only).
    pub fn managed(&self, kind: &Kind, cluster: &Cluster, namespace: Option<&str>) {
        let key = WatchKey {
            account: cluster.account().cloned(),
            group: kind.resource.group.clone(),
            kind: kind.resource.kind.clone(),
            namespace: namespace
                .filter(|_| kind.namespaced && cluster.account().is_some())
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
        let [sharded, unlabelled] = sharded_watches(api, "", self.shards.watch());
        for (part, events) in [(Part::Shards, sharded), (Part::Unlabelled, unlabelled)] {
            let task = self.index(
                (key.clone(), part),
                events,
                kind.resource.api_version.clone(),
                what.clone(),
            );
            self.keep(task);
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
        tokio::spawn(async move {
            tracing::debug!(kind = %what, part = ?key.1, "watching managed objects");
            let mut events = events;
            // The objects of a (re)list, swapped in once it is complete.
            let mut listing: HashMap<ObjectName, Seen> = HashMap::new();
            while let Some(event) = events.next().await {
                let name = |o: &PartialObjectMeta<DynamicObject>| (o.namespace(), o.name_any());
                let index = |update: &dyn Fn(&mut Present)| {
                    if let Ok(mut present) = present.lock() {
                        update(present.entry(key.clone()).or_default());
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
                        listing.insert(name(&o), Seen::of(&o));
                        o
                    }
                    Ok(Event::Apply(o)) => {
                        let n = name(&o);
                        let seen = Seen::of(&o);
                        index(&|p| {
                            p.objects.insert(n.clone(), seen.clone());
                        });
                        o
                    }
                    Ok(Event::Delete(o)) => {
                        let n = name(&o);
                        index(&|p| {
                            p.objects.remove(&n);
                        });
                        o
                    }
                    Err(e) => {
                        tracing::debug!(kind = %what, error = %e, "watch error");
                        continue;
                    }
                };
                if let Some(owner) = owner_of(object.annotations())
                    && trigger.unbounded_send(owner).is_err()
                {
                    return;
                }
            }
        })
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
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config).default_backoff().boxed();
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
        self.keep(task);
    }

    /// Records that `release` reads `inputs` (and nothing else), and wakes it whenever one of
    /// them is created, changed or deleted.
    ///
    /// One metadata-only watch per kind and namespace that some release reads from, started on
    /// first use: a change of data changes the resourceVersion, which is all that is needed,
    /// and Secret data never reaches the operator through it. Per namespace rather than over
    /// the cluster, since releases read inputs from their own namespace, and a cluster-wide
    /// watch would stream every Secret change of the cluster (Helm records, tokens) to be
    /// dropped here.
    pub fn reads(&self, release: &ObjectRef<SequencedRelease>, inputs: HashSet<Input>) {
        let namespaces: HashSet<(InputKind, String)> = inputs
            .iter()
            .map(|(kind, namespace, _)| (*kind, namespace.clone()))
            .collect();
        if let Ok(mut readers) = self.readers.lock() {
            readers.set(release, inputs);
        }
        for (kind, namespace) in namespaces {
            let first = self
                .input_watches
                .lock()
                .is_ok_and(|mut started| started.insert((kind, namespace.clone())));
            if first {
                self.watch_inputs(kind, namespace);
            }
        }
    }

    /// Forgets what a release that is gone read.
    pub fn forget_reads(&self, release: &ObjectRef<SequencedRelease>) {
        if let Ok(mut readers) = self.readers.lock() {
            readers.set(release, HashSet::new());
        }
    }

    fn watch_inputs(&self, kind: InputKind, namespace: String) {
        let trigger = self.trigger.clone();
        let readers = Arc::clone(&self.readers);
        let config = watcher::Config::default().any_semantic();
        let events = match kind {
            InputKind::ConfigMap => {
                let api: Api<PartialObjectMeta<ConfigMap>> =
                    Api::namespaced(self.client.clone(), &namespace);
                watcher(api, config)
                    .default_backoff()
                    .map(|e| e.map(changed))
                    .boxed()
            }
            InputKind::Secret => {
                let api: Api<PartialObjectMeta<Secret>> =
                    Api::namespaced(self.client.clone(), &namespace);
                watcher(api, config)
                    .default_backoff()
                    .map(|e| e.map(changed))
                    .boxed()
            }
        };
        let task = tokio::spawn(async move {
            tracing::debug!(?kind, namespace = %namespace, "watching inputs");
            let mut events = events;
            while let Some(event) = events.next().await {
                let name = match event {
                    Ok(Some(name)) => name,
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::debug!(?kind, namespace = %namespace, error = %e, "watch error");
                        continue;
                    }
                };
                let input = (kind, namespace.clone(), name);
                let owners: Vec<_> = match readers.lock() {
                    Ok(readers) => readers
                        .of
                        .get(&input)
                        .into_iter()
                        .flatten()
                        .cloned()
                        .collect(),
                    Err(_) => return,
                };
                for owner in owners {
                    if trigger.unbounded_send(owner).is_err() {
                        return;
                    }
                }
            }
        });
        self.keep(task);
    }
}

/// The name of the object an event says was listed, created, changed or deleted.
fn changed<K: kube::Resource>(event: Event<K>) -> Option<String> {
    match event {
        Event::Apply(o) | Event::InitApply(o) | Event::Delete(o) => Some(o.name_any()),
        Event::Init | Event::InitDone => None,
    }
}
