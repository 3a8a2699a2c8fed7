//! The ConfigMaps and Secrets releases read (`valuesFrom`, a chart in `configMapRef` or
//! `secretRef`, `credentialsSecretRef`, the kubeconfig of `spec.kubeConfig`): metadata-only
//! watches that wake the releases that read them when they change, and how many changes of each
//! were seen (what a cached reading of one is checked against).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::watcher;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};

use crate::api::SequencedRelease;
use crate::cluster::{Health, reconnecting};

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
    /// How many changes of each input its watch has seen.
    versions: HashMap<Input, u64>,
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

/// The watches of inputs, started as releases first read from a kind and namespace.
pub struct Inputs {
    client: Client,
    /// How the API server has been answering: the watches reconnect as soon as it answers again.
    health: Arc<Health>,
    trigger: UnboundedSender<ObjectRef<SequencedRelease>>,
    readers: Arc<Mutex<Readers>>,
    /// The input watches started, by kind and namespace.
    started: Mutex<HashSet<(InputKind, String)>>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Drop for Inputs {
    fn drop(&mut self) {
        if let Ok(tasks) = self.tasks.get_mut() {
            for task in tasks.drain(..) {
                task.abort();
            }
        }
    }
}

impl Inputs {
    pub fn new(
        client: Client,
        health: Arc<Health>,
        trigger: UnboundedSender<ObjectRef<SequencedRelease>>,
    ) -> Inputs {
        Inputs {
            client,
            health,
            trigger,
            readers: Arc::new(Mutex::new(Readers::default())),
            started: Mutex::new(HashSet::new()),
            tasks: Mutex::new(Vec::new()),
        }
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
                .started
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
                reconnecting(watcher(api, config).boxed(), &self.health)
                    .map(|e| e.map(changed))
                    .boxed()
            }
            InputKind::Secret => {
                let api: Api<PartialObjectMeta<Secret>> =
                    Api::namespaced(self.client.clone(), &namespace);
                reconnecting(watcher(api, config).boxed(), &self.health)
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
                    Ok(mut readers) => {
                        *readers.versions.entry(input.clone()).or_default() += 1;
                        let of = readers.of.get(&input);
                        of.into_iter().flatten().cloned().collect()
                    }
                    Err(_) => return,
                };
                for owner in owners {
                    if trigger.unbounded_send(owner).is_err() {
                        return;
                    }
                }
            }
        });
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.push(task.abort_handle());
        }
    }

    /// How many changes of `input` its watch has seen; None before it saw the input.
    pub fn version(&self, input: &Input) -> Option<u64> {
        self.readers.lock().ok()?.versions.get(input).copied()
    }
}

/// The name of the object an event says was listed, created, changed or deleted.
fn changed<K: kube::Resource>(event: Event<K>) -> Option<String> {
    match event {
        Event::Apply(o) | Event::InitApply(o) | Event::Delete(o) => Some(o.name_any()),
        Event::Init | Event::InitDone => None,
    }
}
