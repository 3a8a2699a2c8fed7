//! The release records in the cluster: one Secret per revision in the SequencedRelease's
//! namespace, in Helm's storage format, read once and cached, created when a revision begins,
//! their status updated as it ends, dropped past `maxHistory` and on uninstall. Records of the
//! earlier format are still read, and rewritten in Helm's format when their status changes.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

use super::{Error, kube_error};
use crate::api::{
    DRIVER_ANNOTATION, DRIVER_HELM, FIELD_MANAGER, Identity, MANAGED_BY, MANAGED_BY_LABEL,
    OWNER_ANNOTATION, ObjectKey, RECORD_KEY, SequencedRelease, helm_records_selector, record_name,
};
use crate::cluster::{Cluster, ClusterError};
use crate::history::helm::{
    HELM_RECORD_KEY, HELM_RECORD_TYPE, HelmRelease, helm_record_name, restatus,
};
use crate::history::{
    Content, HelmStatus, Info, Inventory, Record, RecordError, RecordSummary, Sightings,
};
use crate::rollout::Deployable;
use crate::rollout::RecordUpdate;
use crate::rollout::lifecycle::Revisions;
use crate::rollout::takeover::{Pending, Seen};

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
    /// How long each record under a release's name has stayed unchanged, as seen here.
    sightings: Mutex<HashMap<Release, Sightings>>,
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

/// Whether this release wrote the record (a record of Helm's it took over is still Helm's).
fn is_ours(secret: &Secret, me: &Identity) -> bool {
    let annotations = secret.metadata.annotations.as_ref();
    annotations.and_then(|a| a.get(OWNER_ANNOTATION)) == Some(&me.owner)
        && annotations
            .and_then(|a| a.get(DRIVER_ANNOTATION))
            .map(String::as_str)
            != Some(DRIVER_HELM)
}

/// Whether the record is Helm's (no owner annotation), or one of Helm's this release took over.
fn is_helms_for(secret: &Secret, me: &Identity) -> bool {
    let annotations = secret.metadata.annotations.as_ref();
    match annotations.and_then(|a| a.get(OWNER_ANNOTATION)) {
        None => true,
        Some(owner) => {
            *owner == me.owner
                && annotations
                    .and_then(|a| a.get(DRIVER_ANNOTATION))
                    .map(String::as_str)
                    == Some(DRIVER_HELM)
        }
    }
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
            sightings: Mutex::new(HashMap::new()),
        }
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
        if let Ok(mut sightings) = self.sightings.lock() {
            sightings.remove(release);
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

    /// The revisions of this release's records in Helm's format, and every record under its
    /// release name in the namespace with how long each stayed unchanged as seen here (what
    /// [`crate::rollout::takeover::decide`] judges). Listed also for a release that never had a
    /// revision: a Helm release of the name may have records (not all of them: Helm's
    /// `--history-max` drops the first ones); Helm's records kept as ConfigMaps are looked for
    /// then too.
    pub async fn revisions(
        &self,
        release: &Release,
        me: &Identity,
        _fresh: bool,
    ) -> Result<Revisions, Error> {
        let selector = helm_records_selector(&me.release_name);
        let list = self
            .secrets(release)
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(kube_error(format!(
                "listing the release records of {} in {}",
                me.release_name,
                namespace(release)
            )))?;
        let now = std::time::Instant::now();
        let mut revisions = Revisions::default();
        let mut owners: HashMap<String, bool> = HashMap::new();
        for secret in &list.items {
            let name = secret.metadata.name.clone().unwrap_or_default();
            let empty = Default::default();
            let Some(summary) = RecordSummary::of(
                &name,
                secret.metadata.labels.as_ref().unwrap_or(&empty),
                secret.metadata.annotations.as_ref().unwrap_or(&empty),
                secret
                    .metadata
                    .resource_version
                    .as_deref()
                    .unwrap_or_default(),
            ) else {
                continue;
            };
            if is_ours(secret, me) {
                revisions.ours.insert(summary.revision);
            }
            let owner_gone = match summary.owner.as_deref() {
                Some(owner) if owner != me.owner => match owners.get(owner) {
                    Some(gone) => *gone,
                    None => {
                        let gone = self.release_gone(owner).await?;
                        owners.insert(owner.to_string(), gone);
                        gone
                    }
                },
                _ => false,
            };
            let unchanged_for = self
                .sightings
                .lock()
                .map(|mut all| all.entry(release.clone()).or_default().saw(&summary, now))
                .unwrap_or_default();
            revisions.seen.push(Seen {
                summary,
                unchanged_for,
                owner_gone,
            });
        }
        if let Ok(mut all) = self.sightings.lock() {
            all.entry(release.clone())
                .or_default()
                .keep_only(revisions.seen.iter().map(|s| s.summary.name.as_str()));
        }
        if revisions.ours.is_empty() {
            let maps: Api<ConfigMap> =
                Api::namespaced(self.secrets(release).into_client(), namespace(release));
            let found = maps
                .list_metadata(&ListParams::default().labels(&selector).limit(1))
                .await
                .map_err(kube_error(format!(
                    "looking for Helm's ConfigMap records of {} in {}",
                    me.release_name,
                    namespace(release)
                )))?;
            if !found.items.is_empty() {
                revisions.other_driver = Some("ConfigMap".to_string());
            }
        }
        Ok(revisions)
    }

    /// Whether the SequencedRelease `owner` (`namespace/name`) no longer exists.
    async fn release_gone(&self, owner: &str) -> Result<bool, Error> {
        let Some((ns, name)) = owner.split_once('/') else {
            return Ok(true);
        };
        let api: Api<SequencedRelease> = Api::namespaced(self.client.clone(), ns);
        let found = api
            .get_metadata_opt(name)
            .await
            .map_err(kube_error(format!("reading SequencedRelease {owner}")))?;
        Ok(found.is_none())
    }

    /// Marks the pending record of Helm's `pending` failed ([`crate::rollout::takeover::TAKEN_OVER`]),
    /// only while it is at the resourceVersion it was seen unchanged at; false when it changed
    /// meanwhile (a helm process finished it after all) or is gone.
    pub async fn take_pending(
        &self,
        release: &Release,
        me: &Identity,
        pending: &Pending,
    ) -> Result<bool, Error> {
        let what = format!(
            "taking over the pending release record {}/{}",
            namespace(release),
            pending.record
        );
        let secrets = self.secrets(release);
        let Some(secret) = secrets
            .get_opt(&pending.record)
            .await
            .map_err(kube_error(what.clone()))?
        else {
            return Ok(false);
        };
        if secret.metadata.resource_version.as_deref() != Some(pending.resource_version.as_str()) {
            return Ok(false);
        }
        let description = crate::rollout::takeover::TAKEN_OVER;
        match self
            .restatus(release, me, secret, HelmStatus::Failed, Some(description))
            .await
        {
            Ok(()) => Ok(true),
            Err(Error::Kube {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes record Secret `secret` of Helm's with `status` and `description` (the rest as Helm
    /// wrote it), noting that this release took it over; a replace with the resourceVersion it
    /// was read at.
    async fn restatus(
        &self,
        release: &Release,
        me: &Identity,
        mut secret: Secret,
        status: HelmStatus,
        description: Option<&str>,
    ) -> Result<(), Error> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let what = format!("writing release record {}/{name}", namespace(release));
        let (encoded, _) = restatus(
            &name,
            data_of(&secret, HELM_RECORD_KEY),
            status,
            description,
        )
        .map_err(|e| Error::Internal(format!("{what}: {e}")))?;
        secret.data.get_or_insert_with(Default::default).insert(
            HELM_RECORD_KEY.to_string(),
            ByteString(encoded.into_bytes()),
        );
        secret
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("status".to_string(), status.as_str().to_string());
        let annotations = secret
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotations.insert(OWNER_ANNOTATION.to_string(), me.owner.clone());
        annotations.insert(DRIVER_ANNOTATION.to_string(), DRIVER_HELM.to_string());
        self.secrets(release)
            .replace(&name, &PostParams::default(), &secret)
            .await
            .map_err(kube_error(what))?;
        Ok(())
    }

    /// The record of `revision` that Helm wrote, as what the revision that goes on from it
    /// prunes against: its manifest's objects, each with its namespace as `cluster` scopes its
    /// kind (objects of a kind the cluster does not serve are gone already). None when it is
    /// missing or cannot be read (logged).
    pub async fn helm_record(
        &self,
        release: &Release,
        me: &Identity,
        revision: i64,
        cluster: &Cluster,
    ) -> Result<Option<Record>, Error> {
        let name = helm_record_name(&me.release_name, revision);
        let what = format!("reading release record {}/{name}", namespace(release));
        let Some(secret) = self
            .secrets(release)
            .get_opt(&name)
            .await
            .map_err(kube_error(what))?
        else {
            return Ok(None);
        };
        let helm = match HelmRelease::decode(&name, data_of(&secret, HELM_RECORD_KEY)) {
            Ok(helm) => helm,
            Err(RecordError { name, message }) => {
                tracing::warn!(record = %name, %message, "ignoring an unreadable Helm release record");
                return Ok(None);
            }
        };
        let documents = match crate::yaml::parse_documents(&helm.manifest) {
            Ok(documents) => documents,
            Err(e) => {
                tracing::warn!(record = %name, error = %e, "ignoring the manifest of a Helm release record that does not parse");
                Vec::new()
            }
        };
        let mut objects = Vec::new();
        for document in documents {
            let text = |pointer: &str| document.pointer(pointer).and_then(Value::as_str);
            let (Some(api_version), Some(kind), Some(object_name)) =
                (text("/apiVersion"), text("/kind"), text("/metadata/name"))
            else {
                continue;
            };
            let namespaced = match cluster.kind(api_version, kind).await {
                Ok(kind) => kind.namespaced,
                Err(ClusterError::UnknownKind { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            objects.push(ObjectKey {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                namespace: namespaced.then(|| {
                    text("/metadata/namespace")
                        .unwrap_or(&me.target_namespace)
                        .to_string()
                }),
                name: object_name.to_string(),
            });
        }
        let chart = helm
            .chart
            .metadata
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or(&me.release_name)
            .to_string();
        Ok(Some(Record {
            revision,
            digest: String::new(),
            chart_version: helm
                .chart
                .metadata
                .get("version")
                .and_then(Value::as_str)
                .map(str::to_string),
            sequenced: false,
            inventory: Inventory::of_helm(&chart, objects),
            chart,
            prune: Vec::new(),
            hooks: Vec::new(),
            upgrade: Some(revision > 1),
            crds: None,
            plan: None,
            rollback_to: None,
            went_on_from: None,
            chart_artifact: None,
            tests: Vec::new(),
            content: Content {
                chart_metadata: helm.chart.metadata,
                values: helm.config,
                manifest: helm.manifest,
            },
            info: Info {
                status: helm.info.status,
                description: helm.info.description,
                first_deployed: helm.info.first_deployed,
                last_deployed: helm.info.last_deployed,
            },
        }))
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
        let body = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace(release),
                "labels": labels,
                "annotations": { OWNER_ANNOTATION: me.owner },
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
            return self.update_helms(release, me, update).await;
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

    /// Changes the status of a record of Helm's that this release went on from (the deployed one
    /// its first revision upgraded becomes `superseded`); nothing when the record is not Helm's.
    async fn update_helms(
        &self,
        release: &Release,
        me: &Identity,
        update: &RecordUpdate,
    ) -> Result<(), Error> {
        let name = helm_record_name(&me.release_name, update.revision);
        let what = format!("reading release record {}/{name}", namespace(release));
        let Some(secret) = self
            .secrets(release)
            .get_opt(&name)
            .await
            .map_err(kube_error(what))?
        else {
            return Ok(());
        };
        if !is_helms_for(&secret, me) {
            return Ok(());
        }
        let status = secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("status"))
            .map_or(HelmStatus::Unknown, |s| HelmStatus::parse(s));
        if update.only_from.is_some_and(|from| from != status) || status == update.status {
            return Ok(());
        }
        // Helm leaves a superseded record's description as it was.
        let description =
            (update.status != HelmStatus::Superseded).then_some(update.description.as_str());
        self.restatus(release, me, secret, update.status, description)
            .await
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
