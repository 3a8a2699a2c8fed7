//! Remote clusters (`spec.kubeConfig`): one client per kubeconfig (and per account it
//! impersonates there), what each release targets, and whether each remote cluster answers.
//!
//! A remote cluster is known by the digest of its kubeconfig's bytes: the same Secret content
//! shared by releases is one set of clients, one discovery and one set of watches; a rotated
//! kubeconfig is another cluster from then on, and the clients and watches of the one no release
//! uses any more are dropped. Whether a remote cluster answers is read from its watches (a watch
//! that gets no answer marks it unreachable, and wakes the releases that target it: one with
//! nothing to do says so at once); a release of a cluster marked unreachable asks it once
//! (`/version`) before anything else, and goes on when it answers. Imports `cluster` and `api`
//! only.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use kube::runtime::reflector::ObjectRef;
use sha2::{Digest as _, Sha256};

use crate::api::SequencedRelease;
use crate::cluster::remote::RemoteConfig;
use crate::cluster::{Account, Cluster};

/// How many remote clusters' clients are kept (the least recently used go first).
const REMOTES: std::num::NonZeroUsize = std::num::NonZeroUsize::new(128).expect("not zero");
/// How many impersonating clients are kept per remote cluster.
const ACCOUNTS: std::num::NonZeroUsize = std::num::NonZeroUsize::new(64).expect("not zero");

/// What identifies a remote cluster: the digest of its kubeconfig (never the kubeconfig).
pub(crate) fn remote_id(kubeconfig: &[u8]) -> Arc<str> {
    Arc::from(format!(
        "kubeconfig-sha256:{}",
        &hex::encode(Sha256::digest(kubeconfig))[..16]
    ))
}

/// One remote cluster: its configuration, its API server as the kubeconfig's own identity, and
/// as each account a release impersonates there.
pub(crate) struct Remote {
    pub id: Arc<str>,
    /// The server's URL, for messages.
    pub server: String,
    config: kube::Config,
    /// The API server as the kubeconfig's identity: discovery, records, hook logs.
    pub cluster: Arc<Cluster>,
    accounts: Mutex<lru::LruCache<Account, Arc<Cluster>>>,
}

impl Remote {
    pub fn new(id: Arc<str>, remote: RemoteConfig) -> Result<Remote, kube::Error> {
        let client = kube::Client::try_from(remote.config.clone())?;
        Ok(Remote {
            cluster: Arc::new(Cluster::remote(client, Arc::clone(&id))),
            id,
            server: remote.server,
            config: remote.config,
            accounts: Mutex::new(lru::LruCache::new(ACCOUNTS)),
        })
    }

    /// The API server as `account` (impersonated on the remote cluster), or as the
    /// kubeconfig's own identity.
    pub fn as_account(&self, account: Option<&Account>) -> Result<Arc<Cluster>, kube::Error> {
        let Some(account) = account else {
            return Ok(Arc::clone(&self.cluster));
        };
        let mut accounts = self.accounts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cluster) = accounts.get(account) {
            return Ok(Arc::clone(cluster));
        }
        let cluster = Arc::new(self.cluster.acting_as(&self.config, account.clone())?);
        accounts.put(account.clone(), Arc::clone(&cluster));
        Ok(cluster)
    }
}

/// What a release targets: the remote cluster of its kubeconfig as last read, and the version
/// of the kubeconfig Secret it was read at (see [`Remotes::known`]).
struct Targeted {
    /// The Secret and key it was read from.
    reference: String,
    /// The change count of the Secret the watch of inputs had seen when it was read.
    version: Option<u64>,
    remote: Arc<Remote>,
}

/// Whether a remote cluster answers.
#[derive(Clone, Debug)]
struct Health {
    /// Why it does not, as its watches last failed; None while it answers.
    failing: Option<String>,
}

/// The remote clusters of every release.
pub(crate) struct Remotes {
    by_id: Mutex<lru::LruCache<Arc<str>, Arc<Remote>>>,
    by_release: Mutex<HashMap<ObjectRef<SequencedRelease>, Targeted>>,
    health: Arc<Mutex<HashMap<Arc<str>, Health>>>,
    /// Woken when a remote cluster goes away or comes back: the releases that target it.
    trigger: Mutex<Option<futures::channel::mpsc::UnboundedSender<ObjectRef<SequencedRelease>>>>,
}

impl Default for Remotes {
    fn default() -> Remotes {
        Remotes {
            by_id: Mutex::new(lru::LruCache::new(REMOTES)),
            by_release: Mutex::new(HashMap::new()),
            health: Arc::default(),
            trigger: Mutex::new(None),
        }
    }
}

impl Remotes {
    /// Where releases are woken when their remote cluster goes away or comes back.
    pub fn wake_with(
        &self,
        trigger: futures::channel::mpsc::UnboundedSender<ObjectRef<SequencedRelease>>,
    ) {
        *self.trigger.lock().unwrap_or_else(|e| e.into_inner()) = Some(trigger);
    }

    /// The remote cluster `release` targets, when it was read from `reference` at the Secret's
    /// `version` (a version the watch of inputs has seen: None is never known).
    pub fn known(
        &self,
        release: &ObjectRef<SequencedRelease>,
        reference: &str,
        version: Option<u64>,
    ) -> Option<Arc<Remote>> {
        let by_release = self.by_release.lock().ok()?;
        let targeted = by_release.get(release)?;
        (version.is_some() && targeted.version == version && targeted.reference == reference)
            .then(|| Arc::clone(&targeted.remote))
    }

    /// The remote cluster known as `id` (the digest of its kubeconfig), when it is known.
    pub fn get(&self, id: &Arc<str>) -> Option<Arc<Remote>> {
        self.by_id.lock().ok()?.get(id).cloned()
    }

    /// Keeps `remote` as the one of its id.
    pub fn insert(&self, remote: Arc<Remote>) {
        if let Ok(mut by_id) = self.by_id.lock() {
            by_id.put(Arc::clone(&remote.id), remote);
        }
    }

    /// `release` targets `remote` (None: the cluster the controller runs in), read from
    /// `reference` at `version`. Returns the remote clusters no release targets any more, whose
    /// watches and clients are to be dropped, and whether the release's target changed (its
    /// cached plan and records are then stale).
    pub fn target(
        &self,
        release: &ObjectRef<SequencedRelease>,
        remote: Option<(&Arc<Remote>, &str, Option<u64>)>,
    ) -> (Vec<Arc<str>>, bool) {
        let mut by_release = self.by_release.lock().unwrap_or_else(|e| e.into_inner());
        let before = by_release.get(release).map(|t| Arc::clone(&t.remote.id));
        match remote {
            Some((remote, reference, version)) => {
                by_release.insert(
                    release.clone(),
                    Targeted {
                        reference: reference.to_string(),
                        version,
                        remote: Arc::clone(remote),
                    },
                );
            }
            None => {
                by_release.remove(release);
            }
        }
        let after = remote.map(|(r, _, _)| Arc::clone(&r.id));
        let changed = before != after;
        let mut unused = Vec::new();
        if let Some(old) = before.filter(|old| Some(old) != after.as_ref())
            && !by_release.values().any(|t| t.remote.id == old)
        {
            if let Ok(mut by_id) = self.by_id.lock() {
                by_id.pop(&old);
            }
            if let Ok(mut health) = self.health.lock() {
                health.remove(&old);
            }
            unused.push(old);
        }
        (unused, changed)
    }

    /// Why the remote cluster `id` does not answer, as its watches last saw it; None while it
    /// answers (or nothing of it is watched yet).
    pub fn failing(&self, id: &str) -> Option<String> {
        self.health.lock().ok()?.get(id)?.failing.clone()
    }

    /// The remote cluster `id` answered a request: it is back (a watch that resumes after an
    /// outage yields nothing until something changes, so a request tells it first).
    pub fn answered(&self, id: &str) {
        if let Ok(mut health) = self.health.lock()
            && let Some(entry) = health.get_mut(id)
        {
            entry.failing = None;
        }
    }

    /// The releases that target the remote cluster `id`.
    fn releases_of(&self, id: &str) -> Vec<ObjectRef<SequencedRelease>> {
        self.by_release
            .lock()
            .map(|by_release| {
                by_release
                    .iter()
                    .filter(|(_, t)| &*t.remote.id == id)
                    .map(|(release, _)| release.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Follows the answers of a watch on the remote cluster `id` (a stream of watch events):
    /// an error with no answer from the server marks the cluster unreachable, any event marks
    /// it back; each change wakes the releases that target it.
    pub fn observe<T, E>(
        self: &Arc<Self>,
        id: Arc<str>,
        events: impl Stream<Item = Result<T, E>> + Send + 'static,
    ) -> impl Stream<Item = Result<T, E>> + Send + 'static
    where
        T: Send + 'static,
        E: std::fmt::Display + Unanswered + Send + 'static,
    {
        let remotes = Arc::clone(self);
        events.inspect(move |event| {
            let failing = match event {
                Ok(_) => None,
                Err(e) if e.unanswered() => Some(e.to_string()),
                // An answer, even a refusal: the cluster is there.
                Err(_) => None,
            };
            let changed = {
                let Ok(mut health) = remotes.health.lock() else {
                    return;
                };
                let entry = health
                    .entry(Arc::clone(&id))
                    .or_insert(Health { failing: None });
                let changed = entry.failing.is_some() != failing.is_some();
                entry.failing = failing;
                changed
            };
            if changed {
                let trigger = remotes
                    .trigger
                    .lock()
                    .ok()
                    .and_then(|t| t.as_ref().cloned());
                if let Some(trigger) = trigger {
                    let woken: HashSet<_> = remotes.releases_of(&id).into_iter().collect();
                    for release in woken {
                        let _ = trigger.unbounded_send(release);
                    }
                }
            }
        })
    }
}

/// Whether a watch error is a request that got no answer (see
/// [`crate::cluster::ClusterError::is_unreachable`]).
pub(crate) trait Unanswered {
    fn unanswered(&self) -> bool;
}

impl Unanswered for kube::runtime::watcher::Error {
    fn unanswered(&self) -> bool {
        use kube::runtime::watcher::Error;
        match self {
            Error::InitialListFailed(e) | Error::WatchStartFailed(e) | Error::WatchFailed(e) => {
                crate::cluster::unanswered(e)
            }
            _ => false,
        }
    }
}

/// A stream of watch events, boxed.
pub(crate) type Events<T> =
    futures::stream::BoxStream<'static, Result<T, kube::runtime::watcher::Error>>;

/// `events` of a watch on `cluster`, followed by `remotes` when the cluster is a remote one.
pub(crate) fn followed<T: Send + 'static>(
    remotes: &Arc<Remotes>,
    cluster: &Cluster,
    events: Events<T>,
) -> Events<T> {
    match cluster.remote_id() {
        Some(id) => remotes.observe(Arc::clone(id), events).boxed(),
        None => events,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(kubeconfig: &str) -> Arc<Remote> {
        let config = RemoteConfig {
            config: kube::Config::new("http://127.0.0.1:1".parse().unwrap()),
            server: "http://127.0.0.1:1".to_string(),
        };
        Arc::new(Remote::new(remote_id(kubeconfig.as_bytes()), config).unwrap())
    }

    fn release(name: &str) -> ObjectRef<SequencedRelease> {
        ObjectRef::new(name).within("apps")
    }

    #[tokio::test]
    async fn a_remote_cluster_is_dropped_when_the_last_release_leaves_it() {
        let remotes = Remotes::default();
        let fleet = remote("fleet-a");
        remotes.insert(Arc::clone(&fleet));
        let (a, b) = (release("a"), release("b"));
        assert_eq!(
            remotes.target(&a, Some((&fleet, "fleet-a/None", Some(1)))),
            (Vec::new(), true)
        );
        assert_eq!(
            remotes.target(&b, Some((&fleet, "fleet-a/None", Some(1)))),
            (Vec::new(), true)
        );
        // The same target again changes nothing.
        assert_eq!(
            remotes.target(&a, Some((&fleet, "fleet-a/None", Some(1)))),
            (Vec::new(), false)
        );
        // One release leaves: the cluster is still used.
        assert_eq!(remotes.target(&a, None), (Vec::new(), true));
        assert!(remotes.get(&fleet.id).is_some());
        // The last one leaves: its clients go.
        assert_eq!(
            remotes.target(&b, None),
            (vec![Arc::clone(&fleet.id)], true)
        );
        assert!(remotes.get(&fleet.id).is_none());
    }

    #[tokio::test]
    async fn a_kubeconfig_is_known_only_at_the_version_of_the_secret_it_was_read_at() {
        let remotes = Remotes::default();
        let fleet = remote("fleet-a");
        let a = release("a");
        // Read before the watch of inputs saw the Secret: never taken as known.
        remotes.target(&a, Some((&fleet, "fleet-a/None", None)));
        assert!(remotes.known(&a, "fleet-a/None", None).is_none());
        remotes.target(&a, Some((&fleet, "fleet-a/None", Some(3))));
        assert!(remotes.known(&a, "fleet-a/None", Some(3)).is_some());
        // The Secret changed, or the spec names another key: read again.
        assert!(remotes.known(&a, "fleet-a/None", Some(4)).is_none());
        assert!(
            remotes
                .known(&a, "fleet-a/Some(\"other\")", Some(3))
                .is_none()
        );
        // A rotated kubeconfig is another cluster.
        assert_ne!(remote_id(b"fleet-a"), remote_id(b"fleet-a rotated"));
    }
}
