//! The release records in the cluster: one Secret per revision in the SequencedRelease's
//! namespace, in Helm's storage format, read once and cached, created when a revision begins,
//! their status updated as it ends, dropped past `maxHistory` and on uninstall. Records of the
//! earlier format are still read, and rewritten in Helm's format when their status changes.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

use super::{Error, kube_error};
use crate::api::{
    DRIVER_ANNOTATION, FIELD_MANAGER, Identity, MANAGED_BY, MANAGED_BY_LABEL, OWNER_ANNOTATION,
    RECORD_KEY, SequencedRelease, record_name,
};
use crate::history::helm::{HELM_RECORD_KEY, HELM_RECORD_TYPE, HelmRelease, helm_record_name};
use crate::history::{HelmStatus, Record, RecordError};
use crate::rollout::Deployable;
use crate::rollout::RecordUpdate;
use crate::rollout::lifecycle::Revisions;

type Release = ObjectRef<SequencedRelease>;
/// What records stored, ready to apply, by release and revision.
type Stored = HashMap<(Release, i64), Option<Arc<Deployable>>>;

/// The most a Secret may hold (the API server refuses more), less room for its metadata.
const MAX_RECORD: usize = 1024 * 1024 - 16 * 1024;

/// The records of every release, as read or written by this controller.
pub struct Records {
    client: Client,
    /// The client of each release whose records are on a remote cluster (`spec.kubeConfig`):
    /// Helm's storage is on the cluster that holds the objects.
    remote: Mutex<HashMap<Release, Client>>,
    cached: Mutex<HashMap<(Release, i64), Cached>>,
    stored: Mutex<Stored>,
    /// Releases whose revisions were taken to be none without listing (a release that never
    /// had a revision), until their first record is written.
    assumed: Mutex<HashSet<Release>>,
    /// Releases for which that turned out wrong: their records are listed from now on.
    listed: Mutex<HashSet<Release>>,
    /// Who writes the records, when it is not the operator ([`crate::api::DRIVER_ANNOTATION`]).
    driver: Option<&'static str>,
}

/// What [`Records::put`] did.
#[derive(Debug, PartialEq)]
pub enum Put {
    Written,
    /// The record's name was taken although the release's revisions were taken to be none:
    /// they must be listed before a revision number is chosen.
    Taken,
}

/// A record as the cache keeps it: without its stored plan and Helm's content, which only a
/// rollback and a rewrite of the record need, and which are kept encoded as the Secret holds
/// them (gzip, a few KB) rather than as parsed objects (the rendered plan twice over).
struct Cached {
    record: Arc<Record>,
    /// The Secret's `release` data, when the record is in Helm's format.
    encoded: Option<Arc<[u8]>>,
}

fn namespace(release: &Release) -> &str {
    release.namespace.as_deref().unwrap_or("default")
}

/// Whose a record Secret is: a Helm release, or another SequencedRelease.
fn holder(secret: &Secret) -> String {
    match secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(OWNER_ANNOTATION))
    {
        Some(owner) => format!("SequencedRelease {owner} has its records"),
        None => format!(
            "a Helm release has its records (Secret {})",
            secret.metadata.name.as_deref().unwrap_or_default()
        ),
    }
}

fn is_ours(secret: &Secret, me: &Identity) -> bool {
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(OWNER_ANNOTATION))
        == Some(&me.owner)
}

impl Records {
    pub fn new(client: Client) -> Records {
        Records {
            client,
            remote: Mutex::new(HashMap::new()),
            cached: Mutex::new(HashMap::new()),
            stored: Mutex::new(HashMap::new()),
            assumed: Mutex::new(HashSet::new()),
            listed: Mutex::new(HashSet::new()),
            driver: None,
        }
    }

    /// The records a driver other than the operator writes: each says so in
    /// [`crate::api::DRIVER_ANNOTATION`] (`cli` for the command line).
    pub fn with_driver(mut self, driver: &'static str) -> Records {
        self.driver = Some(driver);
        self
    }

    fn secrets(&self, release: &Release) -> Api<Secret> {
        let client = self
            .remote
            .lock()
            .ok()
            .and_then(|remote| remote.get(release).cloned())
            .unwrap_or_else(|| self.client.clone());
        Api::namespaced(client, namespace(release))
    }

    /// The records of `release` are on the cluster of `client` (a remote cluster's), or (None)
    /// on the one the controller runs in. A release whose target changed forgets what was
    /// cached of its records first.
    pub fn target(&self, release: &Release, client: Option<Client>) {
        if let Ok(mut remote) = self.remote.lock() {
            match client {
                Some(client) => remote.insert(release.clone(), client),
                None => remote.remove(release),
            };
        }
    }

    pub fn forget(&self, release: &Release) {
        if let Ok(mut remote) = self.remote.lock() {
            remote.remove(release);
        }
        if let Ok(mut cached) = self.cached.lock() {
            cached.retain(|(owner, _), _| owner != release);
        }
        if let Ok(mut stored) = self.stored.lock() {
            stored.retain(|(owner, _), _| owner != release);
        }
        for set in [&self.assumed, &self.listed] {
            if let Ok(mut set) = set.lock() {
                set.remove(release);
            }
        }
    }

    /// Caches `record`, whose Secret holds `encoded` (Helm's format): then without its plan
    /// and content, which [`Records::whole`] decodes again when needed.
    fn remember(&self, release: &Release, record: Record, encoded: Option<&[u8]>) -> Arc<Record> {
        let encoded: Option<Arc<[u8]>> = encoded.filter(|e| !e.is_empty()).map(Arc::from);
        let record = Arc::new(match encoded {
            Some(_) => Record {
                plan: None,
                content: Default::default(),
                ..record
            },
            None => record,
        });
        if let Ok(mut cached) = self.cached.lock() {
            cached.insert(
                (release.clone(), record.revision),
                Cached {
                    record: Arc::clone(&record),
                    encoded,
                },
            );
        }
        record
    }

    /// The whole record of `revision`, with its stored plan and content: decoded from what the
    /// cache keeps, or read.
    pub async fn whole(
        &self,
        release: &Release,
        me: &Identity,
        revision: i64,
    ) -> Result<Option<Record>, Error> {
        // Read (and cached) unless it was: the cache then holds what it was encoded as.
        let Some(record) = self.get(release, me, revision).await? else {
            return Ok(None);
        };
        let encoded = self.cached.lock().ok().and_then(|c| {
            c.get(&(release.clone(), revision))
                .and_then(|c| c.encoded.clone())
        });
        let Some(encoded) = encoded else {
            return Ok(Some((*record).clone()));
        };
        let name = helm_record_name(&me.release_name, revision);
        match HelmRelease::decode(&name, &encoded).and_then(|r| Record::from_helm(&name, r)) {
            Ok(whole) => Ok(Some(whole)),
            Err(RecordError { name, message }) => Err(Error::Internal(format!(
                "decoding the cached release record {name}: {message}"
            ))),
        }
    }

    /// The record of `revision`, from the cache or the cluster (in Helm's format, else in the
    /// earlier one); None when there is none (or it cannot be read: it is logged and treated as
    /// missing).
    pub async fn get(
        &self,
        release: &Release,
        me: &Identity,
        revision: i64,
    ) -> Result<Option<Arc<Record>>, Error> {
        let key = (release.clone(), revision);
        if let Some(found) = self
            .cached
            .lock()
            .ok()
            .and_then(|r| r.get(&key).map(|c| Arc::clone(&c.record)))
        {
            return Ok(Some(found));
        }
        let secrets = self.secrets(release);
        let name = helm_record_name(&me.release_name, revision);
        let what = format!("reading release record {}/{name}", namespace(release));
        let decoded = match secrets.get_opt(&name).await.map_err(kube_error(what))? {
            Some(secret) if is_ours(&secret, me) => {
                let data = data_of(&secret, HELM_RECORD_KEY);
                HelmRelease::decode(&name, data)
                    .and_then(|r| Record::from_helm(&name, r))
                    .map(|record| (record, Some(data.to_vec())))
            }
            Some(_) => return Ok(None),
            None => {
                let old = record_name(&release.name, revision);
                let what = format!("reading release record {}/{old}", namespace(release));
                match secrets.get_opt(&old).await.map_err(kube_error(what))? {
                    Some(secret) => {
                        Record::decode(&old, data_of(&secret, RECORD_KEY)).map(|r| (r, None))
                    }
                    None => return Ok(None),
                }
            }
        };
        match decoded {
            Ok((record, encoded)) => Ok(Some(self.remember(release, record, encoded.as_deref()))),
            Err(RecordError { name, message }) => {
                tracing::warn!(record = %name, %message, "ignoring an unreadable release record");
                Ok(None)
            }
        }
    }

    /// What the record of `revision` stored, ready to apply (cached: it is built once).
    pub async fn stored(
        &self,
        release: &Release,
        me: &Identity,
        revision: i64,
    ) -> Result<Option<Arc<Deployable>>, Error> {
        let key = (release.clone(), revision);
        if let Some(found) = self.stored.lock().ok().and_then(|s| s.get(&key).cloned()) {
            return Ok(found);
        }
        let Some(record) = self.whole(release, me, revision).await? else {
            return Ok(None);
        };
        let deployable = Deployable::from_record(&record).map(Arc::new);
        if let Ok(mut stored) = self.stored.lock() {
            stored.insert(key, deployable.clone());
        }
        Ok(deployable)
    }

    /// The revisions of this release's records in Helm's format, and who else uses its release
    /// name in the namespace. A release that never had a revision (`fresh`) is taken to have
    /// none without a list: its first record is created, never replaced, so a name someone
    /// else's records (or an uninstall that kept its history) use is found then
    /// ([`Put::Taken`]), and listed from then on.
    pub async fn revisions(
        &self,
        release: &Release,
        me: &Identity,
        fresh: bool,
    ) -> Result<Revisions, Error> {
        let listed = self.listed.lock().is_ok_and(|l| l.contains(release));
        if fresh
            && !listed
            && let Ok(mut assumed) = self.assumed.lock()
        {
            assumed.insert(release.clone());
            return Ok(Revisions::default());
        }
        let selector = format!("owner=helm,name={}", me.release_name);
        let list = self
            .secrets(release)
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(kube_error(format!(
                "listing the release records of {} in {}",
                me.release_name,
                namespace(release)
            )))?;
        let mut revisions = Revisions::default();
        for secret in &list.items {
            if !is_ours(secret, me) {
                revisions.taken_by.get_or_insert_with(|| holder(secret));
                continue;
            }
            let version = secret
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("version"))
                .and_then(|v| v.parse::<i64>().ok());
            revisions.ours.extend(version);
        }
        Ok(revisions)
    }

    /// The Secret of `record`, in Helm's format. A record too large for a Secret is written
    /// without its stored plan (a rollback to it is then refused, saying why).
    fn secret(
        &self,
        release: &Release,
        me: &Identity,
        record: &Record,
    ) -> Result<Secret, serde_json::Error> {
        let name = helm_record_name(&me.release_name, record.revision);
        let mut helm = record.to_helm(&me.release_name, &me.target_namespace);
        let mut encoded = helm.encode();
        if encoded.len() > MAX_RECORD && record.plan.is_some() {
            tracing::warn!(
                record = %name,
                bytes = encoded.len(),
                "the release record is too large for a Secret with its plan; writing it without (no rollback to this revision)"
            );
            let slim = Record {
                plan: None,
                ..record.clone()
            };
            helm = slim.to_helm(&me.release_name, &me.target_namespace);
            encoded = helm.encode();
        }
        let mut labels = serde_json::Map::new();
        for (k, v) in helm.labels() {
            labels.insert(k, Value::String(v));
        }
        labels.insert(MANAGED_BY_LABEL.to_string(), Value::from(MANAGED_BY));
        let mut annotations = serde_json::Map::new();
        annotations.insert(OWNER_ANNOTATION.to_string(), Value::from(me.owner.clone()));
        if let Some(driver) = self.driver {
            annotations.insert(DRIVER_ANNOTATION.to_string(), Value::from(driver));
        }
        let body = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace(release),
                "labels": labels,
                "annotations": annotations,
            },
            "type": HELM_RECORD_TYPE,
            "data": { HELM_RECORD_KEY: ByteString(encoded.into_bytes()) },
        });
        serde_json::from_value(body)
    }

    /// Writes the record of a new revision. It is created, so that a record someone else wrote
    /// under the same name is never overwritten; one of ours (a retried write) is replaced,
    /// unless the release's revisions were not listed ([`Put::Taken`]).
    pub async fn put(
        &self,
        release: &Release,
        me: &Identity,
        record: &Record,
    ) -> Result<Put, Error> {
        let name = helm_record_name(&me.release_name, record.revision);
        let what = || format!("writing release record {}/{name}", namespace(release));
        let secret = self
            .secret(release, me, record)
            .map_err(|e| Error::Internal(format!("{}: {e}", what())))?;
        let secrets = self.secrets(release);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        let encoded = data_of(&secret, HELM_RECORD_KEY).to_vec();
        let assumed = self
            .assumed
            .lock()
            .is_ok_and(|mut assumed| assumed.remove(release));
        match secrets.create(&params, &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 && assumed => {
                if let Ok(mut listed) = self.listed.lock() {
                    listed.insert(release.clone());
                }
                return Ok(Put::Taken);
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = secrets.get(&name).await.map_err(kube_error(what()))?;
                if !is_ours(&existing, me) {
                    return Err(Error::Internal(format!(
                        "{}: the name is taken: {}",
                        what(),
                        holder(&existing)
                    )));
                }
                self.apply(release, &name, &secret).await?;
            }
            Err(e) => return Err(kube_error(what())(e)),
        }
        self.remember(release, record.clone(), Some(&encoded));
        Ok(Put::Written)
    }

    async fn apply(&self, release: &Release, name: &str, secret: &Secret) -> Result<(), Error> {
        self.secrets(release)
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(secret),
            )
            .await
            .map_err(kube_error(format!(
                "writing release record {}/{name}",
                namespace(release)
            )))?;
        Ok(())
    }

    /// Changes the status of a record, as `update` says. A record of the earlier format is
    /// rewritten in Helm's, and the old Secret deleted.
    pub async fn update(
        &self,
        release: &Release,
        me: &Identity,
        update: &RecordUpdate,
    ) -> Result<(), Error> {
        let Some(record) = self.get(release, me, update.revision).await? else {
            return Ok(());
        };
        let status = record.info.status;
        let applies = update
            .only_from
            .is_none_or(|from| status == from || status == HelmStatus::Unknown);
        let same_tests = update.tests.as_ref().is_none_or(|t| *t == record.tests);
        if !applies
            || (status == update.status
                && record.info.description == update.description
                && same_tests)
        {
            return Ok(());
        }
        // Rewritten whole: with its stored plan and content.
        let Some(mut changed) = self.whole(release, me, update.revision).await? else {
            return Ok(());
        };
        changed.info.status = update.status;
        changed.info.description = update.description.clone();
        if let Some(tests) = &update.tests {
            changed.tests = tests.clone();
        }
        if status == HelmStatus::Unknown {
            // Written in the earlier format: create it in Helm's, then drop the old one.
            self.put(release, me, &changed).await?;
            self.delete_named(release, &record_name(&release.name, changed.revision))
                .await?;
        } else {
            let name = helm_record_name(&me.release_name, changed.revision);
            let secret = self
                .secret(release, me, &changed)
                .map_err(|e| Error::Internal(format!("writing release record {name}: {e}")))?;
            self.apply(release, &name, &secret).await?;
            self.remember(release, changed, Some(data_of(&secret, HELM_RECORD_KEY)));
        }
        Ok(())
    }

    /// Deletes the record of `revision`: in Helm's format when it is one of `ours`, else in the
    /// earlier format.
    pub async fn delete(
        &self,
        release: &Release,
        me: &Identity,
        revision: i64,
        ours: &BTreeSet<i64>,
    ) -> Result<(), Error> {
        if let Ok(mut cached) = self.cached.lock() {
            cached.remove(&(release.clone(), revision));
        }
        if let Ok(mut stored) = self.stored.lock() {
            stored.remove(&(release.clone(), revision));
        }
        let name = if ours.contains(&revision) {
            helm_record_name(&me.release_name, revision)
        } else {
            record_name(&release.name, revision)
        };
        self.delete_named(release, &name).await
    }

    async fn delete_named(&self, release: &Release, name: &str) -> Result<(), Error> {
        match self
            .secrets(release)
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(kube_error(format!(
                "deleting release record {}/{name}",
                namespace(release)
            ))(e)),
        }
    }
}

fn data_of<'a>(secret: &'a Secret, key: &str) -> &'a [u8] {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.as_slice())
        .unwrap_or_default()
}
