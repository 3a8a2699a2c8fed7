//! What wakes a release besides its own object: metadata-only watches on every kind the
//! controller has applied (mapped back to the owning release through the `sequenced.dev/owner`
//! annotation), and watches on the external objects werf charts depend on.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher::watcher};
use kube::{Client, ResourceExt};

use crate::api::{MANAGED_SELECTOR, SequencedRelease, owner_of};
use crate::cluster::Kind;

type Trigger = UnboundedSender<ObjectRef<SequencedRelease>>;

/// A kind by API group and kind (the same objects whatever version serves them).
type GroupKind = (String, String);
/// An object by namespace and name.
type ObjectName = (Option<String>, String);

/// The managed objects of one kind that exist.
#[derive(Default)]
struct Present {
    objects: HashSet<ObjectName>,
    /// The watch's first list is complete: an object not here does not exist.
    synced: bool,
}

/// An external object, by kind, namespace and name.
type ExternalKey = (String, String, Option<String>, String);

/// The set of running watches; each is started once and runs until the controller stops.
pub struct Watches {
    client: Client,
    trigger: Trigger,
    kinds: Mutex<HashSet<(String, String)>>,
    /// The managed objects that exist, by kind, as the managed watches last saw them.
    present: Arc<Mutex<HashMap<GroupKind, Present>>>,
    external: Arc<Mutex<HashMap<ExternalKey, HashSet<ObjectRef<SequencedRelease>>>>>,
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
    pub fn new(client: Client, trigger: Trigger) -> Watches {
        Watches {
            client,
            trigger,
            kinds: Mutex::new(HashSet::new()),
            present: Arc::new(Mutex::new(HashMap::new())),
            external: Arc::new(Mutex::new(HashMap::new())),
            tasks: Mutex::new(Vec::new()),
        }
    }

    fn keep(&self, task: tokio::task::JoinHandle<()>) {
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.push(task.abort_handle());
        }
    }

    /// Watches the metadata of every object of `kind` that the controller manages.
    pub fn managed(&self, kind: &Kind) {
        let key = (
            kind.resource.api_version.clone(),
            kind.resource.kind.clone(),
        );
        {
            let Ok(mut kinds) = self.kinds.lock() else {
                return;
            };
            if !kinds.insert(key) {
                return;
            }
        }
        let api: Api<PartialObjectMeta<DynamicObject>> =
            Api::all_with(self.client.clone(), &kind.resource);
        let config = watcher::Config::default()
            .labels(MANAGED_SELECTOR)
            .any_semantic();
        let trigger = self.trigger.clone();
        let what = format!("{}/{}", kind.resource.api_version, kind.resource.kind);
        let group_kind = (kind.resource.group.clone(), kind.resource.kind.clone());
        let present = Arc::clone(&self.present);
        let task = tokio::spawn(async move {
            tracing::debug!(kind = %what, "watching managed objects");
            let mut events = watcher(api, config).default_backoff().boxed();
            // The objects of a (re)list, swapped in once it is complete.
            let mut listing: HashSet<ObjectName> = HashSet::new();
            while let Some(event) = events.next().await {
                let name = |o: &PartialObjectMeta<DynamicObject>| (o.namespace(), o.name_any());
                let index = |update: &dyn Fn(&mut Present)| {
                    if let Ok(mut present) = present.lock() {
                        update(present.entry(group_kind.clone()).or_default());
                    }
                };
                let object = match event {
                    Ok(Event::Init) => {
                        listing.clear();
                        continue;
                    }
                    Ok(Event::InitDone) => {
                        let listed = std::mem::take(&mut listing);
                        index(&|p| {
                            p.objects.clone_from(&listed);
                            p.synced = true;
                        });
                        continue;
                    }
                    Ok(Event::InitApply(o)) => {
                        listing.insert(name(&o));
                        o
                    }
                    Ok(Event::Apply(o)) => {
                        let n = name(&o);
                        index(&|p| {
                            p.objects.insert(n.clone());
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
        });
        self.keep(task);
    }

    /// Whether a managed object of this group and kind exists, as its watch last saw it; None
    /// while the kind is not watched or its first list is not complete.
    pub fn exists(
        &self,
        group: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<bool> {
        let present = self.present.lock().ok()?;
        let index = present.get(&(group.to_string(), kind.to_string()))?;
        index.synced.then(|| {
            index
                .objects
                .contains(&(namespace.map(str::to_string), name.to_string()))
        })
    }

    /// Wakes `owner` when the external object changes (werf's external dependencies).
    pub fn external(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
        owner: ObjectRef<SequencedRelease>,
    ) {
        let key: ExternalKey = (
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
        let api: Api<PartialObjectMeta<DynamicObject>> = match namespace {
            Some(ns) if kind.namespaced => {
                Api::namespaced_with(self.client.clone(), ns, &kind.resource)
            }
            _ => Api::all_with(self.client.clone(), &kind.resource),
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
}
