//! The release lock (DESIGN.md, "Lock and recovery"): one `coordination.k8s.io/v1` Lease per
//! SequencedRelease, in the release's namespace.
//!
//! - The holder is `<controller identity>/<session id>`; a session is one operation of one
//!   controller process, with a random id. `leaseDurationSeconds` is the release's
//!   `spec.timeout`.
//! - Acquiring writes with the resourceVersion the controller read, so of two controllers racing
//!   for a lease only one write succeeds; the other gets 409 Conflict (or AlreadyExists).
//! - The holder renews at every step of an operation and clears the holder when it ends.
//! - A lease held by another session is taken over only once this controller has seen it stay
//!   unchanged (same resourceVersion) for its whole duration, timed on this controller's monotonic
//!   clock. The lease's `renewTime` is never compared with the local clock, so clock skew between
//!   nodes cannot cause a takeover (client-go's leader election judges the same way).
//! - A watch on the leases keeps those sightings current and wakes a release whose lease another
//!   controller has just released.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;
use kube::{Client, Resource, ResourceExt};
use sha2::{Digest as _, Sha256};

use crate::api::{
    LockStatus, MANAGED_BY, MANAGED_BY_LABEL, MANAGED_SELECTOR, OWNER_ANNOTATION, SHARD_LABEL,
    SequencedRelease, owner_of, owner_value,
};

pub mod shards;
pub use shards::{Sharding, Shards};

/// Lease names: this prefix and the release's name.
pub const LEASE_PREFIX: &str = "sequenced.lock.";
/// The longest object name the API server accepts.
const MAX_NAME: usize = 253;

type Release = ObjectRef<SequencedRelease>;

/// The name of the Lease that locks release `name`: `sequenced.lock.<name>`, or for names too
/// long for that, a cut name and a hash of the whole.
pub fn lease_name(name: &str) -> String {
    let full = format!("{LEASE_PREFIX}{name}");
    if full.len() <= MAX_NAME {
        return full;
    }
    let hash = hex::encode(&Sha256::digest(name.as_bytes())[..5]);
    let keep = MAX_NAME - LEASE_PREFIX.len() - hash.len() - 1;
    let mut cut = name[..name.floor_char_boundary(keep)].to_string();
    while cut.ends_with(['.', '-']) {
        cut.pop();
    }
    format!("{LEASE_PREFIX}{cut}-{hash}")
}

/// `holderIdentity`: the controller and the session.
pub fn holder_identity(identity: &str, session: &str) -> String {
    format!("{identity}/{session}")
}

/// Splits a `holderIdentity` into controller and session (the session is empty when the holder
/// is not one of ours).
pub fn split_holder(holder: &str) -> (&str, &str) {
    holder.rsplit_once('/').unwrap_or((holder, ""))
}

/// A new random session id: 16 hex digits.
pub fn new_session() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// What this controller has seen of one lease, and since when it has been the same.
#[derive(Debug, Clone, PartialEq)]
pub struct Sighting {
    pub resource_version: String,
    /// The holder, when someone holds it.
    pub holder: Option<String>,
    pub duration: Duration,
    /// When this controller first saw this resourceVersion (its own monotonic clock).
    pub since: Instant,
    /// Written by a sharded replica (it carries the shard label), which keeps a member Lease
    /// while it acts.
    pub sharded: bool,
}

impl Sighting {
    /// The sighting of `lease` at `now`, given the previous one: the time it was first seen is
    /// kept while the lease stays unchanged.
    pub fn of(lease: &Lease, previous: Option<&Sighting>, now: Instant) -> Sighting {
        let resource_version = lease.resource_version().unwrap_or_default();
        let spec = lease.spec.as_ref();
        let since = match previous {
            Some(p) if p.resource_version == resource_version => p.since,
            _ => now,
        };
        Sighting {
            resource_version,
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            duration: Duration::from_secs(
                spec.and_then(|s| s.lease_duration_seconds)
                    .and_then(|s| u64::try_from(s).ok())
                    .unwrap_or(0),
            ),
            since,
            sharded: lease.labels().contains_key(SHARD_LABEL),
        }
    }
}

/// Where a lease stands for a controller that does not hold it.
#[derive(Debug, Clone, PartialEq)]
pub enum Standing {
    /// Nobody holds it.
    Free,
    /// Someone holds it and has renewed it within its duration, as far as this controller saw.
    Held { holder: String, remaining: Duration },
    /// Someone holds it, but it has stayed unchanged for its whole duration.
    Expired {
        holder: String,
        unchanged_for: Duration,
    },
}

/// Judges a sighting at `now` (pure).
pub fn standing(sighting: &Sighting, now: Instant) -> Standing {
    let Some(holder) = sighting.holder.clone() else {
        return Standing::Free;
    };
    let unchanged_for = now.saturating_duration_since(sighting.since);
    if unchanged_for >= sighting.duration {
        Standing::Expired {
            holder,
            unchanged_for,
        }
    } else {
        Standing::Held {
            holder,
            remaining: sighting.duration - unchanged_for,
        }
    }
}

/// How an attempt to get (or keep) the lock went.
#[derive(Debug, Clone, PartialEq)]
pub enum Acquired {
    /// Already held and not due for renewal: nothing written.
    Kept,
    /// Already held; renewed now.
    Renewed,
    /// It was free: a new session.
    Fresh,
    /// There was no lease: this controller created it, so no other session has acted on the
    /// release since its lease was last removed.
    Created,
    /// It had expired in another session's hands.
    TakenOver {
        previous: String,
        unchanged_for: Duration,
    },
    /// Another session holds it (or won the race for it): try again when it may expire.
    Busy {
        holder: String,
        retry_after: Duration,
    },
    /// This controller held it, but another session has it now.
    Lost { holder: String },
}

/// A Lease could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

/// A lease this controller holds.
#[derive(Debug, Clone)]
struct Held {
    session: String,
    /// The lease as last written (its resourceVersion is the precondition of the next write).
    lease: Lease,
    /// When the last write was sent: nobody can take the lease over before `renewed + duration`.
    renewed: Instant,
    duration: Duration,
    locked_until: Time,
}

/// The releases' locks, as one controller process sees and holds them.
pub struct Locks {
    client: Client,
    identity: String,
    held: Mutex<HashMap<Release, Held>>,
    seen: Mutex<HashMap<Release, Sighting>>,
    /// Releases blocked by another session's lease, to wake when it is released.
    waiting: Mutex<HashSet<Release>>,
    watch: Mutex<Option<tokio::task::AbortHandle>>,
    /// The shards of this replica: which replicas are dead, and each release's shard label.
    shards: std::sync::Arc<Shards>,
    /// Release Leases held by earlier sessions of this controller's own identity (a process
    /// killed and started again under the same name, as a restarted container), found at start.
    earlier: Mutex<HashMap<Release, Lease>>,
    /// Whether a session of this identity that this process does not hold is over (an
    /// operator's identity is one process at a time). Not for the command line: two commands
    /// of one user on one host share an identity and each is alive until its Lease expires.
    own_sessions_over: bool,
}

impl Drop for Locks {
    fn drop(&mut self) {
        if let Ok(Some(watch)) = self.watch.get_mut().map(Option::take) {
            watch.abort();
        }
    }
}

/// Locks a mutex, recovering from poisoning (a panicked reconcile must not stop the others).
fn guard<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn micro_now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// The time `duration` from now, to whole seconds, as status shows it.
fn until(duration: Duration) -> Time {
    let now = Timestamp::now();
    let later = now
        .checked_add(SignedDuration::try_from(duration).unwrap_or(SignedDuration::MAX))
        .unwrap_or(now);
    Time(Timestamp::from_second(later.as_second()).unwrap_or(later))
}

fn seconds_i32(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX)
}

impl Locks {
    pub fn new(client: Client, identity: String, shards: std::sync::Arc<Shards>) -> Locks {
        Locks {
            client,
            identity,
            shards,
            held: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
            waiting: Mutex::new(HashSet::new()),
            watch: Mutex::new(None),
            earlier: Mutex::new(HashMap::new()),
            own_sessions_over: true,
        }
    }

    /// The locks of a command-line session (`sequenced upgrade`): as [`Locks::new`], except
    /// that a Lease held by another session of the same identity (another command of the same
    /// user on the same host, or one killed) is waited for until it expires, as any other
    /// holder's.
    pub fn for_command_line(
        client: Client,
        identity: String,
        shards: std::sync::Arc<Shards>,
    ) -> Locks {
        let mut locks = Locks::new(client, identity, shards);
        locks.own_sessions_over = false;
        locks
    }

    /// Finds the release Leases that earlier sessions of this controller's identity hold (a
    /// process killed with them, started again under the same name): one list of the managed
    /// Leases. Those of releases in its shards it takes over when it reconciles them; the others
    /// [`Locks::release_earlier`] releases, since nobody else would take them before they expire.
    pub async fn find_earlier(&self) -> Result<(), kube::Error> {
        let api: Api<Lease> = Api::all(self.client.clone());
        let listed = api
            .list(&kube::api::ListParams::default().labels(MANAGED_SELECTOR))
            .await?;
        let held = guard(&self.held);
        let mut earlier = guard(&self.earlier);
        for lease in listed.items {
            let Some(release) = owner_of(lease.annotations()) else {
                continue;
            };
            let ours = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                .is_some_and(|h| split_holder(h).0 == self.identity);
            if ours && !held.contains_key(&release) {
                earlier.insert(release, lease);
            }
        }
        Ok(())
    }

    /// Releases the Leases of earlier sessions of this identity on releases whose shard is not in
    /// `owned` (see [`Locks::find_earlier`]). A Lease changed since it was listed is left alone.
    pub async fn release_earlier(&self, owned: &std::collections::BTreeSet<u32>) {
        let due: Vec<(Release, Lease)> = {
            let mut earlier = guard(&self.earlier);
            let due: Vec<Release> = earlier
                .iter()
                .filter(|(_, lease)| {
                    lease
                        .labels()
                        .get(SHARD_LABEL)
                        .and_then(|n| n.parse::<u32>().ok())
                        .is_none_or(|n| !owned.contains(&n))
                })
                .map(|(release, _)| release.clone())
                .collect();
            due.into_iter()
                .filter_map(|release| earlier.remove_entry(&release))
                .collect()
        };
        for (release, mut lease) in due {
            lease.metadata.managed_fields = None;
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
                spec.renew_time = Some(micro_now());
            }
            match self
                .api(&release)
                .replace(&lease_name(&release.name), &PostParams::default(), &lease)
                .await
            {
                Ok(lease) => {
                    tracing::info!(release = %release, "released the lock an earlier process of this controller held");
                    self.saw(&release, &lease);
                }
                Err(e) => {
                    tracing::debug!(release = %release, error = %e, "releasing the lock of an earlier process")
                }
            }
        }
    }

    fn api(&self, release: &Release) -> Api<Lease> {
        Api::namespaced(self.client.clone(), api_namespace(release))
    }

    /// Watches the leases of the releases of this replica's shards, and those without a shard
    /// label (written before shards existed; labelled at their next write), to keep the sightings
    /// current and to wake, via `trigger`, a release waiting for a lease that has just been
    /// released.
    pub fn watch(self: &std::sync::Arc<Self>, trigger: UnboundedSender<Release>) {
        let api: Api<Lease> = Api::all(self.client.clone());
        let locks = std::sync::Arc::downgrade(self);
        let [sharded, unlabelled] = shards::sharded_watches(
            api,
            MANAGED_SELECTOR,
            self.shards.watch(),
            self.shards.health(),
        );
        let mut events = futures::stream::select(sharded, unlabelled);
        let task = tokio::spawn(async move {
            while let Some(event) = events.next().await {
                let Some(locks) = locks.upgrade() else {
                    return;
                };
                let (lease, deleted) = match event {
                    Ok(Event::Apply(l) | Event::InitApply(l)) => (l, false),
                    Ok(Event::Delete(l)) => (l, true),
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::debug!(error = %e, "lease watch error");
                        continue;
                    }
                };
                let Some(release) = owner_of(lease.annotations()) else {
                    continue;
                };
                let free = deleted || locks.saw(&release, &lease) == Standing::Free;
                if free
                    && guard(&locks.waiting).remove(&release)
                    && trigger.unbounded_send(release).is_err()
                {
                    return;
                }
            }
        });
        *guard(&self.watch) = Some(task.abort_handle());
    }

    /// Records a sighting of `lease` and judges it.
    fn saw(&self, release: &Release, lease: &Lease) -> Standing {
        let now = Instant::now();
        let mut seen = guard(&self.seen);
        let sighting = Sighting::of(lease, seen.get(release), now);
        let verdict = standing(&sighting, now);
        seen.insert(release.clone(), sighting);
        verdict
    }

    /// Whether the session `holder` of a lease seen as `sighting` is over: it belongs to a
    /// replica whose member Lease expired (or, for a lease a sharded replica wrote, is gone), or
    /// it is an earlier session of this controller's own identity that it no longer holds (a
    /// lease it could not release while the API server was away, or one of the process this one
    /// replaced under the same name).
    fn dead(&self, holder: &str, sighting: &Sighting) -> bool {
        let (identity, _) = split_holder(holder);
        (self.own_sessions_over && identity == self.identity)
            || self.shards.is_dead(identity, sighting.sharded)
    }

    /// Whether this controller holds the release's lock.
    pub fn holds(&self, release: &Release) -> bool {
        guard(&self.held).contains_key(release)
    }

    /// When another session holds the release's lease and, as far as this controller has seen,
    /// it is still valid: how long until it may expire. The release is woken when the lease is
    /// released. No API call.
    pub fn blocked(&self, release: &Release) -> Option<(String, Duration)> {
        if self.holds(release) {
            return None;
        }
        let sighting = guard(&self.seen).get(release).cloned()?;
        match standing(&sighting, Instant::now()) {
            Standing::Held { holder, .. } if self.dead(&holder, &sighting) => None,
            Standing::Held { holder, remaining } => {
                guard(&self.waiting).insert(release.clone());
                Some((holder, remaining))
            }
            _ => None,
        }
    }

    /// Whether the lock is held with time to spare: nobody else can take it over before
    /// `renewed + duration`, and a fifth of the duration is kept as margin for clock rates.
    pub fn safely_held(&self, release: &Release) -> bool {
        guard(&self.held)
            .get(release)
            .is_some_and(|h| h.renewed.elapsed() < h.duration.mul_f64(0.8))
    }

    /// The lock as `status.lock` shows it, while this controller holds it.
    pub fn mirror(&self, release: &Release) -> Option<LockStatus> {
        guard(&self.held).get(release).map(|h| LockStatus {
            holder: Some(self.identity.clone()),
            session_id: Some(h.session.clone()),
            locked_until: Some(h.locked_until.clone()),
        })
    }

    /// The releases whose locks this controller holds.
    pub fn held(&self) -> Vec<Release> {
        guard(&self.held).keys().cloned().collect()
    }

    /// Gets the release's lock, or keeps it: renews a held lock when `renew` is set or a third of
    /// its duration has passed. A lock that was not held is read fresh and acquired when free or
    /// expired, with the resourceVersion read as precondition.
    pub async fn acquire(
        &self,
        sr: &SequencedRelease,
        duration: Duration,
        renew: bool,
    ) -> Result<Acquired, LockError> {
        let release = ObjectRef::from_obj(sr);
        let held = guard(&self.held).get(&release).cloned();
        if let Some(held) = held {
            if !renew && held.renewed.elapsed() < held.duration / 3 && held.duration == duration {
                return Ok(Acquired::Kept);
            }
            return self.renew(&release, held, duration).await;
        }
        let api = self.api(&release);
        let name = lease_name(&release.name);
        let session = new_session();
        let sent = Instant::now();
        // No lease seen (the lease watch shows them all): create one without reading first; an
        // AlreadyExists answer falls back to reading it.
        if !guard(&self.seen).contains_key(&release) {
            let lease = self.lease(sr, &name, &session, duration, None);
            match api.create(&PostParams::default(), &lease).await {
                Ok(lease) => {
                    guard(&self.waiting).remove(&release);
                    self.keep(&release, session, lease, duration, sent);
                    return Ok(Acquired::Created);
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(source) => return Err(api_error("writing", &release)(source)),
            }
        }
        let current = api
            .get_opt(&name)
            .await
            .map_err(api_error("reading", &release))?;
        let (outcome, lease) = match current {
            None => {
                let lease = self.lease(sr, &name, &session, duration, None);
                let created = api.create(&PostParams::default(), &lease).await;
                match self.won(&release, created)? {
                    Ok(lease) => (Acquired::Fresh, lease),
                    Err(busy) => return Ok(busy),
                }
            }
            Some(current) => {
                let outcome = match self.saw(&release, &current) {
                    Standing::Free => Acquired::Fresh,
                    // Its holder's replica is dead (its member Lease expired, or is gone): this
                    // replica owns the release's shard now, and nobody else acts on it.
                    Standing::Held { holder, .. }
                        if self.dead(&holder, &Sighting::of(&current, None, Instant::now())) =>
                    {
                        Acquired::TakenOver {
                            previous: holder,
                            unchanged_for: Duration::ZERO,
                        }
                    }
                    Standing::Held { holder, remaining } => {
                        guard(&self.waiting).insert(release.clone());
                        return Ok(Acquired::Busy {
                            holder,
                            retry_after: remaining,
                        });
                    }
                    Standing::Expired {
                        holder,
                        unchanged_for,
                    } => Acquired::TakenOver {
                        previous: holder,
                        unchanged_for,
                    },
                };
                let lease = self.lease(sr, &name, &session, duration, Some(&current));
                let replaced = api.replace(&name, &PostParams::default(), &lease).await;
                match self.won(&release, replaced)? {
                    Ok(lease) => (outcome, lease),
                    Err(busy) => return Ok(busy),
                }
            }
        };
        guard(&self.waiting).remove(&release);
        self.keep(&release, session, lease, duration, sent);
        Ok(outcome)
    }

    /// The answer to a create or replace that tries to take the lease: the lease written, or
    /// (on 409) Busy: another session was faster.
    fn won(
        &self,
        release: &Release,
        answer: kube::Result<Lease>,
    ) -> Result<Result<Lease, Acquired>, LockError> {
        match answer {
            Ok(lease) => Ok(Ok(lease)),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                guard(&self.waiting).insert(release.clone());
                Ok(Err(Acquired::Busy {
                    holder: "another controller".to_string(),
                    // Its lease is new: it lasts at least until the next sighting expires.
                    retry_after: Duration::from_millis(500),
                }))
            }
            Err(source) => Err(api_error("writing", release)(source)),
        }
    }

    /// Records a lease this controller has just written; `sent` is when the write was sent.
    fn keep(
        &self,
        release: &Release,
        session: String,
        lease: Lease,
        duration: Duration,
        sent: Instant,
    ) {
        guard(&self.seen).insert(release.clone(), Sighting::of(&lease, None, sent));
        guard(&self.earlier).remove(release);
        guard(&self.held).insert(
            release.clone(),
            Held {
                session,
                lease,
                renewed: sent,
                duration,
                locked_until: until(duration),
            },
        );
    }

    async fn renew(
        &self,
        release: &Release,
        held: Held,
        duration: Duration,
    ) -> Result<Acquired, LockError> {
        let sent = Instant::now();
        let mut lease = held.lease.clone();
        lease.metadata.managed_fields = None;
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.renew_time = Some(micro_now());
        spec.lease_duration_seconds = Some(seconds_i32(duration));
        let name = lease_name(&release.name);
        match self
            .api(release)
            .replace(&name, &PostParams::default(), &lease)
            .await
        {
            Ok(lease) => {
                self.keep(release, held.session, lease, duration, sent);
                Ok(Acquired::Renewed)
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                guard(&self.held).remove(release);
                let holder = match self.api(release).get_opt(&name).await {
                    Ok(Some(current)) => {
                        self.saw(release, &current);
                        current
                            .spec
                            .and_then(|s| s.holder_identity)
                            .unwrap_or_else(|| "nobody".to_string())
                    }
                    _ => "another controller".to_string(),
                };
                Ok(Acquired::Lost { holder })
            }
            Err(source) => Err(api_error("renewing", release)(source)),
        }
    }

    /// The lease that gives the lock to `session`, replacing `current` when there is one.
    fn lease(
        &self,
        sr: &SequencedRelease,
        name: &str,
        session: &str,
        duration: Duration,
        current: Option<&Lease>,
    ) -> Lease {
        let release = ObjectRef::from_obj(sr);
        let now = micro_now();
        let mut metadata = current.map(|c| c.metadata.clone()).unwrap_or(ObjectMeta {
            name: Some(name.to_string()),
            namespace: release.namespace.clone(),
            ..ObjectMeta::default()
        });
        metadata.managed_fields = None;
        let labels = metadata.labels.get_or_insert_with(Default::default);
        labels.insert(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string());
        if let Some(uid) = sr.uid() {
            labels.insert(SHARD_LABEL.to_string(), self.shards.shard(&uid).to_string());
        }
        metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                OWNER_ANNOTATION.to_string(),
                owner_value(api_namespace(&release), &release.name),
            );
        if let Some(uid) = sr.uid() {
            let owner = OwnerReference {
                api_version: SequencedRelease::api_version(&()).to_string(),
                kind: SequencedRelease::kind(&()).to_string(),
                name: release.name.clone(),
                uid,
                ..OwnerReference::default()
            };
            let owners = metadata.owner_references.get_or_insert_with(Vec::new);
            if !owners.iter().any(|o| o.uid == owner.uid) {
                owners.push(owner);
            }
        }
        let previous = current.and_then(|c| c.spec.as_ref());
        let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
        let changed_hands = previous
            .and_then(|s| s.holder_identity.as_deref())
            .is_some_and(|h| !h.is_empty());
        Lease {
            metadata,
            spec: Some(LeaseSpec {
                holder_identity: Some(holder_identity(&self.identity, session)),
                lease_duration_seconds: Some(seconds_i32(duration)),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(transitions.saturating_add(i32::from(changed_hands))),
                ..LeaseSpec::default()
            }),
        }
    }

    /// Clears the holder of a lock this controller holds: the operation is over. A lease that
    /// changed meanwhile is someone else's and is left alone.
    pub async fn release(&self, release: &Release) -> Result<(), LockError> {
        let Some(held) = guard(&self.held).remove(release) else {
            return Ok(());
        };
        let held_again = held.clone();
        let mut lease = held.lease;
        lease.metadata.managed_fields = None;
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = Some(micro_now());
        }
        let name = lease_name(&release.name);
        match self
            .api(release)
            .replace(&name, &PostParams::default(), &lease)
            .await
        {
            Ok(lease) => {
                self.saw(release, &lease);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(()),
            // The lease was deleted with its namespace, and the namespace being deleted refuses
            // to create it again (an update of an absent Lease creates it): there is no lock to
            // wait for any more, not even this controller's own last sighting of it.
            Err(kube::Error::Api(s)) if s.code == 403 => {
                guard(&self.seen).remove(release);
                Ok(())
            }
            Err(source) => {
                // Still held (the API server did not answer, say): kept, to be released or
                // renewed later rather than left to expire in a session this controller forgot.
                guard(&self.held).insert(release.clone(), held_again);
                Err(api_error("releasing", release)(source))
            }
        }
    }

    /// Deletes the release's lease once the release is uninstalled, unless it changed since this
    /// controller last wrote it.
    pub async fn remove(&self, release: &Release) -> Result<(), LockError> {
        let held = guard(&self.held).remove(release);
        guard(&self.seen).remove(release);
        guard(&self.waiting).remove(release);
        let Some(held) = held else {
            return Ok(());
        };
        let name = lease_name(&release.name);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: held.lease.resource_version(),
                uid: held.lease.uid(),
            }),
            ..DeleteParams::default()
        };
        match self.api(release).delete(&name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(()),
            Err(source) => Err(api_error("deleting", release)(source)),
        }
    }
}

fn api_namespace(release: &Release) -> &str {
    release.namespace.as_deref().unwrap_or("default")
}

/// A failed API call on the release's lease: `<doing> Lease <namespace>/<name>: <error>`.
fn api_error(doing: &str, release: &Release) -> impl FnOnce(kube::Error) -> LockError {
    let what = format!(
        "{doing} Lease {}/{}",
        api_namespace(release),
        lease_name(&release.name)
    );
    move |source| LockError::Api { what, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(rv: &str, holder: Option<&str>, seconds: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                resource_version: Some(rv.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(seconds),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_lease_expires_only_after_staying_unchanged_for_its_duration() {
        let t0 = Instant::now();
        let first = Sighting::of(&lease("7", Some("a/1"), 10), None, t0);
        assert_eq!(
            standing(&first, t0 + Duration::from_secs(4)),
            Standing::Held {
                holder: "a/1".into(),
                remaining: Duration::from_secs(6)
            }
        );
        // Seen again unchanged: the clock keeps running from the first sighting.
        let again = Sighting::of(
            &lease("7", Some("a/1"), 10),
            Some(&first),
            t0 + Duration::from_secs(9),
        );
        assert!(matches!(
            standing(&again, t0 + Duration::from_secs(10)),
            Standing::Expired { .. }
        ));
        // Renewed (a new resourceVersion): valid for a whole duration again.
        let renewed = Sighting::of(
            &lease("8", Some("a/1"), 10),
            Some(&again),
            t0 + Duration::from_secs(9),
        );
        assert!(matches!(
            standing(&renewed, t0 + Duration::from_secs(18)),
            Standing::Held { .. }
        ));
    }

    #[test]
    fn a_lease_without_holder_is_free() {
        let t0 = Instant::now();
        for holder in [None, Some("")] {
            let s = Sighting::of(&lease("1", holder, 10), None, t0);
            assert_eq!(standing(&s, t0), Standing::Free);
        }
    }

    #[test]
    fn lease_names_fit_the_api_server() {
        assert_eq!(lease_name("shop"), "sequenced.lock.shop");
        let long = "a".repeat(253);
        let name = lease_name(&long);
        assert!(name.len() <= 253, "{}", name.len());
        assert_ne!(name, lease_name(&"a".repeat(252)));
    }

    #[test]
    fn holders_split_into_controller_and_session() {
        let holder = holder_identity("sequenced-7d9f-x2", "00ff");
        assert_eq!(split_holder(&holder), ("sequenced-7d9f-x2", "00ff"));
        assert_eq!(split_holder("kube-scheduler"), ("kube-scheduler", ""));
        assert_eq!(new_session().len(), 16);
    }
}
