//! Shards (DESIGN.md, "Lock and recovery"): releases are hashed to a fixed number of shards
//! ([`crate::api::shard_of`]), and each replica holds shards through one Lease per shard,
//! `sequenced.shard.<n>`, in the operator's namespace. Every replica also holds a member Lease,
//! `sequenced.member.<identity>`, so that the others know how many replicas share the shards.
//!
//! Every `lease_duration / 3` a replica lists those Leases (one request) and renews its member
//! Lease (one write): a shard Lease names its holder and stays valid as long as the holder's
//! member Lease does, so holding any number of shards costs one write a round. It then evens the
//! shards out: it holds at most `ceil(shards / live members)`, gives back what is above that (a
//! new replica takes it at its next round), and claims shards that are free or whose holder's
//! member Lease expired, up to it. Expiry is judged as for the release lock
//! ([`super::standing`]): a Lease seen unchanged for its whole duration on this replica's own
//! clock. A replica acts on its shards only while it renewed its member Lease within 4/5 of its
//! duration, so a replica cut off from the API server stops acting before another may take its
//! shards. A stopped replica gives its shards back at once; a dead one loses them when its member
//! Lease expires, and the release Leases it held are taken over at once by the new owners.
//!
//! Kubernetes is the coordinator: no other store, no leader.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use sha2::{Digest as _, Sha256};

use super::{Sighting, Standing, standing};
use crate::api::{SHARD_LABEL, SHARD_LEASE_LABEL, SHARDS_ANNOTATION, shard_of};
use crate::cluster::{Health, reconnecting};

/// The default number of shards (`sequenced run --shards`).
pub const DEFAULT_SHARDS: u32 = 32;
/// The default duration of a shard Lease (`sequenced run --shard-lease-duration`).
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// A member Lease whose `renewTime` is older than this many of its durations, by this replica's
/// clock, is judged dead at once (a replica started after a crash need not watch it stay
/// unchanged for a whole duration), with [`CLOCK_SKEW`] more to spare for clocks that differ.
const STALE_DURATIONS: u32 = 4;
/// How far two replicas' clocks may differ.
const CLOCK_SKEW: Duration = Duration::from_secs(30);

/// How releases are divided among replicas.
#[derive(Debug, Clone)]
pub struct Sharding {
    /// How many shards; the same for every replica.
    pub shards: u32,
    /// Where the shard and member Leases live (the operator's namespace).
    pub namespace: String,
    /// How long a shard Lease lasts without renewal.
    pub lease_duration: Duration,
}

impl Default for Sharding {
    fn default() -> Sharding {
        Sharding {
            shards: DEFAULT_SHARDS,
            namespace: "default".to_string(),
            lease_duration: DEFAULT_LEASE_DURATION,
        }
    }
}

/// The shards a replica owns.
pub type Owned = Arc<BTreeSet<u32>>;

/// The name of shard `n`'s Lease.
pub fn shard_lease(n: u32) -> String {
    format!("sequenced.shard.{n}")
}

/// The name of a replica's member Lease: `sequenced.member.<identity>`, the identity made a valid
/// name (lower case, `[a-z0-9.-]`), with a hash of the whole when it had to change or is long.
pub fn member_lease(identity: &str) -> String {
    let clean: String = identity
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    let clean = clean.trim_matches(['-', '.']).to_string();
    if clean == identity && clean.len() <= 200 {
        return format!("sequenced.member.{clean}");
    }
    let hash = hex::encode(&Sha256::digest(identity.as_bytes())[..5]);
    let cut = &clean[..clean.floor_char_boundary(180)];
    format!("sequenced.member.{cut}-{hash}")
}

/// Whether a member Lease was last renewed so long before `now` (by its `renewTime` and this
/// replica's clock) that its replica is dead whatever this replica saw of it: more than
/// [`STALE_DURATIONS`] of its durations and [`CLOCK_SKEW`]. (A Lease without `renewTime` is
/// judged by sightings only.)
pub fn stale(lease: &Lease, now: Timestamp) -> bool {
    let Some(spec) = lease.spec.as_ref() else {
        return false;
    };
    let (Some(renewed), Some(seconds)) = (spec.renew_time.as_ref(), spec.lease_duration_seconds)
    else {
        return false;
    };
    let duration = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    let limit = duration.saturating_mul(STALE_DURATIONS) + CLOCK_SKEW;
    let Ok(limit) = k8s_openapi::jiff::SignedDuration::try_from(limit) else {
        return false;
    };
    now.duration_since(renewed.0) > limit
}

/// A shard's Lease as one replica judges it.
#[derive(Debug, Clone, PartialEq)]
pub enum ShardStanding {
    /// This replica holds it.
    Mine,
    /// Nobody holds it, it has expired, or it does not exist.
    Free,
    /// Another replica holds it.
    Taken,
}

/// What a replica does with the shards in one round (pure).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Moves {
    /// Free or expired shards to claim.
    pub claim: Vec<u32>,
    /// Shards held above this replica's share, to give back.
    pub give_back: Vec<u32>,
}

/// The moves of replica `me` (pure): `shards[n]` is shard n's standing, `live` how many
/// replicas hold a valid member Lease (this one included). A replica holds at most
/// `ceil(shards / live)`; it gives back the highest above that, and claims free ones up to it,
/// starting at a point of the ring that depends on its identity, so that replicas starting
/// together do not all race for shard 0.
pub fn moves(me: &str, shards: &[ShardStanding], live: usize) -> Moves {
    let count = shards.len();
    if count == 0 {
        return Moves::default();
    }
    let share = count.div_ceil(live.max(1));
    let mine: Vec<u32> = (0..count)
        .filter(|&n| shards[n] == ShardStanding::Mine)
        .map(|n| n as u32)
        .collect();
    if mine.len() > share {
        return Moves {
            claim: Vec::new(),
            give_back: mine[share..].to_vec(),
        };
    }
    let start = shard_of(me, count as u32) as usize;
    let claim = (0..count)
        .map(|i| (start + i) % count)
        .filter(|&n| shards[n] == ShardStanding::Free)
        .take(share - mine.len())
        .map(|n| n as u32)
        .collect();
    Moves {
        claim,
        give_back: Vec::new(),
    }
}

/// The label selector of the objects of `owned` shards: `sequenced.dev/shard in (0,5,7)`; None
/// when no shard is owned (nothing to select).
pub fn selector(owned: &BTreeSet<u32>) -> Option<String> {
    if owned.is_empty() {
        return None;
    }
    let list: Vec<String> = owned.iter().map(u32::to_string).collect();
    Some(format!("{SHARD_LABEL} in ({})", list.join(",")))
}

/// A watch that follows the owned shards: `make` is called with the selector of the current
/// shards, and again each time they change, its stream replacing the one before (which starts
/// with a fresh list, so a store or index fed by it is replaced whole). With no shard owned, the
/// stream is `empty` (an empty list, as a watch of nothing would give).
pub fn following<T: Send + 'static>(
    owned: tokio::sync::watch::Receiver<Owned>,
    make: impl Fn(&str) -> BoxStream<'static, T> + Send + 'static,
    empty: impl Fn() -> BoxStream<'static, T> + Send + 'static,
) -> BoxStream<'static, T> {
    let state = (owned, None::<BoxStream<'static, T>>, make, empty);
    futures::stream::unfold(state, |(mut owned, mut current, make, empty)| async move {
        loop {
            let stream = match current.as_mut() {
                Some(stream) => stream,
                None => {
                    let shards = owned.borrow_and_update().clone();
                    current.insert(match selector(&shards) {
                        Some(selector) => make(&selector),
                        None => empty(),
                    })
                }
            };
            tokio::select! {
                item = stream.next() => {
                    return item.map(|item| (item, (owned, current, make, empty)));
                }
                changed = owned.changed() => {
                    if changed.is_err() {
                        // The shards are gone with the controller: the current watch goes on.
                        let item = stream.next().await?;
                        return Some((item, (owned, current, make, empty)));
                    }
                    current = None;
                }
            }
        }
    })
    .boxed()
}

/// A watch event of `K`, or the error of its watch.
pub type Watched<K> = Result<kube::runtime::watcher::Event<K>, kube::runtime::watcher::Error>;

/// The two watches of `api` a replica needs: `[its shards' objects, objects without a shard
/// label]`, each also selected by `selector` (`""` for nothing more). The first follows the owned
/// shards ([`following`]; with none owned, an empty list); the second sees objects of no release
/// and those applied before shards existed. Both reconnect as [`reconnecting`] says: as soon as
/// the API server answers again, and at once after a 410.
pub fn sharded_watches<K>(
    api: Api<K>,
    selector: &str,
    owned: tokio::sync::watch::Receiver<Owned>,
    health: &Arc<Health>,
) -> [BoxStream<'static, Watched<K>>; 2]
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use kube::runtime::watcher::{self, Event, watcher};
    let with = |extra: &str| match selector {
        "" => extra.to_string(),
        _ => format!("{selector},{extra}"),
    };
    let config = watcher::Config::default().any_semantic();
    let sharded = {
        let (api, config, base) = (api.clone(), config.clone(), selector.to_string());
        let health = Arc::clone(health);
        following(
            owned,
            move |shards| {
                let labels = match base.as_str() {
                    "" => shards.to_string(),
                    _ => format!("{base},{shards}"),
                };
                reconnecting(
                    watcher(api.clone(), config.clone().labels(&labels)).boxed(),
                    &health,
                )
            },
            || {
                futures::stream::iter([Ok(Event::Init), Ok(Event::InitDone)])
                    .chain(futures::stream::pending())
                    .boxed()
            },
        )
    };
    let unlabelled = reconnecting(
        watcher(api, config.labels(&with(&format!("!{SHARD_LABEL}")))).boxed(),
        health,
    );
    [sharded, unlabelled]
}

/// This replica's member Lease, as last written, and when that write was sent (on the monotonic
/// clock and the wall clock).
#[derive(Debug, Clone)]
struct Held {
    lease: Lease,
    renewed: Instant,
    renewed_at: Timestamp,
}

/// What one replica knows of the shards.
#[derive(Default)]
struct State {
    /// Shard Leases held, by shard, as last read or written (valid while the member Lease is).
    held: BTreeMap<u32, Lease>,
    /// This replica's member Lease, as last written.
    member: Option<Held>,
    /// Every shard and member Lease seen, by name.
    seen: HashMap<String, Sighting>,
    /// The last round could not reach the API server.
    cut_off: bool,
}

/// How a round of shard keeping went, for the controller: the shards gained and lost, and
/// whether the API server answers again after a round that could not reach it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Round {
    pub gained: Vec<u32>,
    pub lost: Vec<u32>,
    pub reconnected: bool,
    /// The round could not reach the API server, or was refused.
    pub failed: bool,
}

/// The shards one replica holds, kept by [`Shards::round`].
pub struct Shards {
    client: Client,
    identity: String,
    sharding: Sharding,
    state: Mutex<State>,
    owned: tokio::sync::watch::Sender<Owned>,
    /// Identities whose member Lease has expired: their release Leases may be taken at once.
    dead: Mutex<HashSet<String>>,
    /// Identities with a member Lease, alive or not, at the last listing (None before one): a
    /// sharded replica keeps one while it acts, so a release Lease written by a sharded replica
    /// that has none any more is nobody's.
    members: Mutex<Option<HashSet<String>>>,
    /// How the API server has been answering.
    health: Arc<Health>,
}

fn guard<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn micro_now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl Shards {
    pub fn new(
        client: Client,
        identity: String,
        sharding: Sharding,
        health: Arc<Health>,
    ) -> Shards {
        let (owned, _) = tokio::sync::watch::channel(Arc::new(BTreeSet::new()));
        Shards {
            client,
            identity,
            sharding,
            state: Mutex::new(State::default()),
            owned,
            dead: Mutex::new(HashSet::new()),
            members: Mutex::new(None),
            health,
        }
    }

    /// How the API server has been answering.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    pub fn count(&self) -> u32 {
        self.sharding.shards.max(1)
    }

    /// The shards owned now, and each change of them.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<Owned> {
        self.owned.subscribe()
    }

    /// The shard of a release by its uid.
    pub fn shard(&self, uid: &str) -> u32 {
        shard_of(uid, self.count())
    }

    /// Whether this replica owns the shard of the release whose uid is `uid`.
    pub fn owns(&self, uid: &str) -> bool {
        self.owned.borrow().contains(&self.shard(uid))
    }

    /// The shards whose Lease names this replica, as of the last round: the shards it owns,
    /// and those it does not act on while it cannot renew its member Lease (cut off) but that
    /// nobody else took meanwhile.
    pub fn held(&self) -> BTreeSet<u32> {
        guard(&self.state).held.keys().copied().collect()
    }

    /// Whether this replica owns every shard (then its watches see every managed object).
    pub fn owns_all(&self) -> bool {
        self.owned.borrow().len() == self.count() as usize
    }

    /// Whether `identity` is a replica whose member Lease expired (it is dead, or cut off for
    /// longer than a Lease lasts, and acts no more), or, for a Lease written by a sharded replica
    /// (`sharded`: it carries the shard label), one that has no member Lease any more (deleted
    /// by the replica that took its shards over, or by itself on shutdown).
    pub fn is_dead(&self, identity: &str, sharded: bool) -> bool {
        if identity == self.identity {
            return false;
        }
        if guard(&self.dead).contains(identity) {
            return true;
        }
        sharded
            && guard(&self.members)
                .as_ref()
                .is_some_and(|members| !members.contains(identity))
    }

    fn api(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.sharding.namespace)
    }

    /// How often [`Shards::round`] runs.
    pub fn period(&self) -> Duration {
        self.sharding.lease_duration / 3
    }

    /// One round: list the Leases, renew what is held, even the shards out; then publish the
    /// shards this replica may act on.
    pub async fn round(&self) -> Round {
        let before = self.owned.borrow().clone();
        let kept = self.keep().await;
        let failed = kept.is_err();
        let reconnected = match kept {
            Ok(()) => std::mem::replace(&mut guard(&self.state).cut_off, false),
            Err(e) => {
                let mut state = guard(&self.state);
                if !state.cut_off {
                    tracing::warn!(error = %e, namespace = %self.sharding.namespace, "keeping the shard Leases");
                }
                state.cut_off = true;
                false
            }
        };
        // Shards are acted on while this replica's member Lease was renewed within 4/5 of its
        // duration: before anyone may judge it expired and take them.
        let safe = self.sharding.lease_duration.mul_f64(0.8);
        let now: BTreeSet<u32> = {
            let state = guard(&self.state);
            let alive = state
                .member
                .as_ref()
                .is_some_and(|m| m.renewed.elapsed() < safe);
            if alive {
                state.held.keys().copied().collect()
            } else {
                BTreeSet::new()
            }
        };
        let gained: Vec<u32> = now.difference(&before).copied().collect();
        let lost: Vec<u32> = before.difference(&now).copied().collect();
        if !gained.is_empty() || !lost.is_empty() {
            tracing::info!(?gained, ?lost, owned = now.len(), "shards moved");
            self.owned.send_replace(Arc::new(now));
        }
        Round {
            gained,
            lost,
            reconnected,
            failed,
        }
    }

    async fn keep(&self) -> Result<(), kube::Error> {
        let api = self.api();
        let listed = api
            .list(&ListParams::default().labels(SHARD_LEASE_LABEL))
            .await?;
        let now = Instant::now();
        let count = self.count();
        let mut members: HashSet<String> = HashSet::from([self.identity.clone()]);
        let mut known: HashSet<String> = HashSet::from([self.identity.clone()]);
        let mut dead = HashSet::new();
        // The member Leases of dead replicas, by holder: deleted once none of their shards is
        // left to take over.
        let mut dead_members: HashMap<String, Lease> = HashMap::new();
        let mut shard_leases: BTreeMap<u32, Lease> = BTreeMap::new();
        // Others' renewals are judged against this replica's own last one: after an outage
        // nobody renewed, and nobody is stale for that. A replica starting has none: now.
        let reference = guard(&self.state)
            .member
            .as_ref()
            .map_or_else(Timestamp::now, |m| m.renewed_at);
        let mut own_member = None;
        let was_dead = guard(&self.dead).clone();
        {
            let mut state = guard(&self.state);
            let cut_off = state.cut_off;
            let mut seen = HashMap::new();
            for lease in listed.items {
                let name = lease.name_any();
                match lease.labels().get(SHARD_LEASE_LABEL).map(String::as_str) {
                    Some("member") => {
                        if name == member_lease(&self.identity) {
                            own_member = Some(lease);
                            continue;
                        }
                        // After a round that could not reach the API server, every sighting
                        // starts again: nobody's Lease expired while nobody could renew. But a
                        // replica already judged dead before stays dead (its Lease unchanged),
                        // or it would count as live for one more duration and its shards be
                        // divided among one replica too many.
                        let previous = state.seen.get(&name).filter(|seen| {
                            !cut_off || seen.holder.as_ref().is_some_and(|h| was_dead.contains(h))
                        });
                        let sighting = Sighting::of(&lease, previous, now);
                        if let Some(holder) = sighting.holder.clone() {
                            known.insert(holder.clone());
                            let alive = match standing(&sighting, now) {
                                Standing::Held { .. } => !stale(&lease, reference),
                                Standing::Expired { .. } => false,
                                Standing::Free => true,
                            };
                            if alive {
                                members.insert(holder);
                            } else {
                                dead.insert(holder.clone());
                                dead_members.insert(holder, lease.clone());
                            }
                        }
                        seen.insert(name, sighting);
                    }
                    Some("shard") => {
                        let n = lease
                            .labels()
                            .get(SHARD_LABEL)
                            .and_then(|n| n.parse::<u32>().ok())
                            .filter(|n| *n < count);
                        if let Some(n) = n {
                            shard_leases.insert(n, lease);
                        }
                    }
                    _ => {}
                }
            }
            state.seen = seen;
        }
        dead.retain(|d| !members.contains(d));
        dead_members.retain(|d, _| dead.contains(d));
        *guard(&self.dead) = dead;
        *guard(&self.members) = Some(known);
        // Only the member Lease is renewed: a shard is held as long as its holder's member
        // Lease is, so keeping any number of shards costs one write a round.
        self.renew_member(&api, own_member.as_ref()).await?;
        let mut standings = vec![ShardStanding::Free; count as usize];
        {
            let mut state = guard(&self.state);
            for (n, lease) in &shard_leases {
                let holder = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_deref())
                    .unwrap_or_default();
                standings[*n as usize] = if holder == self.identity {
                    ShardStanding::Mine
                } else if members.contains(holder) {
                    ShardStanding::Taken
                } else {
                    // Nobody, or a replica whose member Lease expired (or that has none).
                    ShardStanding::Free
                };
                if holder == self.identity {
                    state.held.insert(*n, lease.clone());
                } else if state.held.remove(n).is_some() {
                    tracing::warn!(shard = n, holder, "another replica holds the shard now");
                }
            }
            // A shard whose Lease is gone is nobody's.
            state.held.retain(|n, _| shard_leases.contains_key(n));
        }
        let moves = moves(&self.identity, &standings, members.len());
        for n in moves.give_back {
            let held = guard(&self.state).held.remove(&n);
            if let Some(held) = held {
                self.give_back(&api, n, held).await;
            }
        }
        for n in moves.claim {
            let current = shard_leases.get(&n);
            let lease = self.lease(n, current);
            let written = match current {
                Some(_) => {
                    api.replace(&shard_lease(n), &PostParams::default(), &lease)
                        .await
                }
                None => api.create(&PostParams::default(), &lease).await,
            };
            match written {
                Ok(lease) => {
                    guard(&self.state).held.insert(n, lease);
                }
                // Another replica was faster.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        // A dead replica's member Lease goes once none of its shards is left to take over
        // (this replica took the last of them, or it held none): replicas started later need
        // not judge it again, and Leases of pods replaced at every crash do not pile up. Its
        // release Leases stay nobody's ([`Shards::is_dead`]). The precondition leaves alone a
        // Lease renewed meanwhile (the replica was only cut off).
        let holders: HashSet<String> = shard_leases
            .iter()
            .filter(|(n, _)| !guard(&self.state).held.contains_key(n))
            .filter_map(|(_, lease)| lease.spec.as_ref()?.holder_identity.clone())
            .collect();
        for (holder, lease) in dead_members {
            if holders.contains(&holder) {
                continue;
            }
            let params = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    resource_version: lease.resource_version(),
                    uid: lease.uid(),
                }),
                ..DeleteParams::default()
            };
            match api.delete(&lease.name_any(), &params).await {
                Ok(_) => {
                    tracing::info!(replica = %holder, "deleted the member Lease of a dead replica")
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    tracing::debug!(replica = %holder, error = %e, "deleting the member Lease of a dead replica")
                }
            }
        }
        Ok(())
    }

    async fn renew_member(
        &self,
        api: &Api<Lease>,
        current: Option<&Lease>,
    ) -> Result<(), kube::Error> {
        let name = member_lease(&self.identity);
        let written = guard(&self.state).member.clone();
        let base = current.or(written.as_ref().map(|h| &h.lease));
        let mut lease = self.member(&name, base);
        let sent = Instant::now();
        let renewed_at = Timestamp::now();
        let answer = match base {
            Some(_) => api.replace(&name, &PostParams::default(), &lease).await,
            None => api.create(&PostParams::default(), &lease).await,
        };
        let answer = match answer {
            // Written by this replica's previous process, or deleted: write it anew.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                let fresh = api.get_opt(&name).await?;
                lease = self.member(&name, fresh.as_ref());
                match fresh {
                    Some(_) => api.replace(&name, &PostParams::default(), &lease).await,
                    None => api.create(&PostParams::default(), &lease).await,
                }
            }
            other => other,
        }?;
        guard(&self.state).member = Some(Held {
            lease: answer,
            renewed: sent,
            renewed_at,
        });
        Ok(())
    }

    fn member(&self, name: &str, current: Option<&Lease>) -> Lease {
        let mut lease = self.base(name, current);
        lease
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(SHARD_LEASE_LABEL.to_string(), "member".to_string());
        lease
    }

    fn lease(&self, n: u32, current: Option<&Lease>) -> Lease {
        let mut lease = self.base(&shard_lease(n), current);
        let labels = lease.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(SHARD_LEASE_LABEL.to_string(), "shard".to_string());
        labels.insert(SHARD_LABEL.to_string(), n.to_string());
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(SHARDS_ANNOTATION.to_string(), self.count().to_string());
        lease
    }

    /// A Lease held by this replica, renewed now; `current` is the Lease as read or last written
    /// (its resourceVersion the precondition of the write).
    fn base(&self, name: &str, current: Option<&Lease>) -> Lease {
        let mut metadata = current.map(|c| c.metadata.clone()).unwrap_or(ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(self.sharding.namespace.clone()),
            ..ObjectMeta::default()
        });
        metadata.managed_fields = None;
        let previous = current.and_then(|c| c.spec.as_ref());
        let ours = previous
            .and_then(|s| s.holder_identity.as_deref())
            .is_some_and(|h| h == self.identity);
        let now = micro_now();
        let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
        Lease {
            metadata,
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(
                    i32::try_from(self.sharding.lease_duration.as_secs().max(1))
                        .unwrap_or(i32::MAX),
                ),
                acquire_time: if ours {
                    previous.and_then(|s| s.acquire_time.clone())
                } else {
                    Some(now.clone())
                },
                renew_time: Some(now),
                lease_transitions: Some(transitions.saturating_add(i32::from(!ours))),
                ..LeaseSpec::default()
            }),
        }
    }

    /// Clears the holder of a shard Lease this replica held: another takes it at its next round.
    async fn give_back(&self, api: &Api<Lease>, n: u32, mut lease: Lease) {
        lease.metadata.managed_fields = None;
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = Some(micro_now());
        }
        if let Err(e) = api
            .replace(&shard_lease(n), &PostParams::default(), &lease)
            .await
        {
            tracing::debug!(shard = n, error = %e, "giving back a shard");
        }
    }

    /// On shutdown: stop acting on any shard, give every shard back and remove the member Lease,
    /// so that the other replicas take the shards at their next round.
    pub async fn hand_over(&self) {
        self.owned.send_replace(Arc::new(BTreeSet::new()));
        let api = self.api();
        let held = std::mem::take(&mut guard(&self.state).held);
        futures::future::join_all(
            held.into_iter()
                .map(|(n, lease)| self.give_back(&api, n, lease)),
        )
        .await;
        let member = guard(&self.state).member.take();
        if let Some(member) = member {
            let _ = api
                .delete(&member.lease.name_any(), &DeleteParams::default())
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ShardStanding::*;

    #[test]
    fn a_lone_replica_claims_every_free_shard() {
        let m = moves("a", &[Free, Free, Free, Free], 1);
        assert_eq!(m.claim.len(), 4);
        assert!(m.give_back.is_empty());
    }

    #[test]
    fn a_replica_gives_back_what_is_above_its_share() {
        // 6 shards, 3 live replicas: a share of 2.
        let m = moves("a", &[Mine, Mine, Mine, Mine, Taken, Taken], 3);
        assert_eq!(m.give_back, vec![2, 3]);
        assert!(m.claim.is_empty());
    }

    #[test]
    fn a_replica_claims_free_shards_up_to_its_share_only() {
        let m = moves("a", &[Mine, Free, Free, Free, Taken, Taken], 2);
        assert_eq!(m.claim.len(), 2);
        assert!(m.claim.iter().all(|n| [1, 2, 3].contains(n)));
    }

    #[test]
    fn selectors_name_the_owned_shards() {
        assert_eq!(selector(&BTreeSet::new()), None);
        assert_eq!(
            selector(&BTreeSet::from([0, 7, 31])).as_deref(),
            Some("sequenced.dev/shard in (0,7,31)")
        );
    }

    #[test]
    fn member_lease_names_are_valid_names() {
        assert_eq!(
            member_lease("sequenced-7d4b9c-x2l8q"),
            "sequenced.member.sequenced-7d4b9c-x2l8q"
        );
        let odd = member_lease("Scale_Controller/1");
        assert!(
            odd.starts_with("sequenced.member.scale-controller-1-"),
            "{odd}"
        );
        assert!(member_lease(&"x".repeat(400)).len() <= 253);
    }

    #[test]
    fn a_member_lease_renewed_long_ago_is_stale_by_its_renew_time() {
        let lease = |renewed: Timestamp| Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some("a".into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(renewed)),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        let now = Timestamp::now();
        let ago = |s: i64| {
            now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
                .unwrap()
        };
        // Four durations (60 s) and the clock skew allowance (30 s).
        assert!(!stale(&lease(ago(89)), now));
        assert!(stale(&lease(ago(91)), now));
        // A clock ahead of this one is not stale.
        assert!(!stale(&lease(ago(-3600)), now));
        assert!(!stale(&Lease::default(), now));
    }

    #[test]
    fn shards_spread_evenly() {
        let mut counts = [0u32; 4];
        for i in 0..4000 {
            counts[shard_of(&format!("uid-{i}"), 4) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }
}
