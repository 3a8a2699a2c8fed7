//! The release records in the cluster: one Secret per revision next to the SequencedRelease,
//! read once and cached, written when a revision begins, dropped past `maxHistory` and on
//! uninstall.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use super::{Error, kube_error};
use crate::api::{
    FIELD_MANAGER, MANAGED_BY, MANAGED_BY_LABEL, OWNER_ANNOTATION, RECORD_KEY, RECORD_TYPE,
    SequencedRelease, owner_value, record_name,
};
use crate::history::{Record, RecordError};

type Release = ObjectRef<SequencedRelease>;

/// The records of every release, as read or written by this controller.
pub(super) struct Records {
    client: Client,
    cached: Mutex<HashMap<(Release, i64), Arc<Record>>>,
}

fn namespace(release: &Release) -> &str {
    release.namespace.as_deref().unwrap_or("default")
}

impl Records {
    pub fn new(client: Client) -> Records {
        Records {
            client,
            cached: Mutex::new(HashMap::new()),
        }
    }

    fn secrets(&self, release: &Release) -> Api<Secret> {
        Api::namespaced(self.client.clone(), namespace(release))
    }

    pub fn forget(&self, release: &Release) {
        if let Ok(mut cached) = self.cached.lock() {
            cached.retain(|(owner, _), _| owner != release);
        }
    }

    /// The record of `revision`, from the cache or the cluster; None when there is none (or it
    /// cannot be read: it is logged and treated as missing).
    pub async fn get(
        &self,
        release: &Release,
        revision: i64,
    ) -> Result<Option<Arc<Record>>, Error> {
        let key = (release.clone(), revision);
        if let Some(found) = self.cached.lock().ok().and_then(|r| r.get(&key).cloned()) {
            return Ok(Some(found));
        }
        let name = record_name(&release.name, revision);
        let what = format!("reading release record {}/{name}", namespace(release));
        let Some(secret) = self
            .secrets(release)
            .get_opt(&name)
            .await
            .map_err(kube_error(what))?
        else {
            return Ok(None);
        };
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(RECORD_KEY))
            .map(|b| b.0.as_slice())
            .unwrap_or_default();
        match Record::decode(&name, bytes) {
            Ok(record) => {
                let record = Arc::new(record);
                if let Ok(mut cached) = self.cached.lock() {
                    cached.insert(key, Arc::clone(&record));
                }
                Ok(Some(record))
            }
            Err(RecordError { name, message }) => {
                tracing::warn!(record = %name, %message, "ignoring an unreadable release record");
                Ok(None)
            }
        }
    }

    /// Writes the record of a new revision (server-side apply, so a retried write is the same).
    pub async fn put(&self, release: &Release, record: &Record) -> Result<(), Error> {
        let name = record_name(&release.name, record.revision);
        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace(release),
                "labels": { MANAGED_BY_LABEL: MANAGED_BY },
                "annotations": { OWNER_ANNOTATION: owner_value(namespace(release), &release.name) },
            },
            "type": RECORD_TYPE,
            "data": { RECORD_KEY: ByteString(record.encode()) },
        });
        self.secrets(release)
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await
            .map_err(kube_error(format!(
                "writing release record {}/{name}",
                namespace(release)
            )))?;
        if let Ok(mut cached) = self.cached.lock() {
            cached.retain(|(owner, _), _| owner != release);
            cached.insert((release.clone(), record.revision), Arc::new(record.clone()));
        }
        Ok(())
    }

    /// Deletes the record of `revision`, if there is one.
    pub async fn delete(&self, release: &Release, revision: i64) -> Result<(), Error> {
        let name = record_name(&release.name, revision);
        if let Ok(mut cached) = self.cached.lock() {
            cached.remove(&(release.clone(), revision));
        }
        match self
            .secrets(release)
            .delete(&name, &DeleteParams::default())
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
