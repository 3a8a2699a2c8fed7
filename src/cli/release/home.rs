//! The command line's home of a release (the executor's [`Home`], as the operator's is the
//! SequencedRelease object): there is no object, so the release lives in this process, and its
//! status is kept in the release record of the revision it is at (the annotation
//! [`CLI_STATUS_ANNOTATION`]), where the next command, on this machine or another, reads it
//! back and goes on from it. The finalizer is the process's own; the notes are printed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::output::Output;
use crate::api::{
    CLI_STATUS_ANNOTATION, SequencedRelease, SequencedReleaseStatus, helm_records_selector,
};
use crate::controller::{Context, Error, Home, Written};
use crate::history::RecordSummary;
use crate::history::helm::helm_record_name;
use crate::rollout::Note;

/// The field manager of the status annotation: apart from the record's own fields, which the
/// executor writes as `sequenced` by server-side apply, so that neither write removes the
/// other's.
const STATUS_MANAGER: &str = "sequenced-cli";

/// The records under a release name, and the status the newest of the command line's left.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Every record Secret of the name, by revision.
    pub records: Vec<(RecordSummary, BTreeMap<String, String>)>,
    /// The status kept in the newest record, when it has one (the command line wrote it).
    pub status: Option<SequencedReleaseStatus>,
}

/// Reads the records of release `name` in `namespace` (one list; Helm's labels).
pub async fn load(client: &kube::Client, namespace: &str, name: &str) -> Result<Loaded, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let list = secrets
        .list(&ListParams::default().labels(&helm_records_selector(name)))
        .await
        .map_err(|e| format!("listing the release records of {name} in {namespace}: {e}"))?;
    let mut records = Vec::new();
    for secret in list.items {
        let meta = &secret.metadata;
        let labels = meta.labels.clone().unwrap_or_default();
        let annotations = meta.annotations.clone().unwrap_or_default();
        if let Some(summary) = RecordSummary::of(
            meta.name.as_deref().unwrap_or_default(),
            &labels,
            &annotations,
            meta.resource_version.as_deref().unwrap_or_default(),
        ) {
            records.push((summary, annotations));
        }
    }
    records.sort_by_key(|(summary, _)| summary.revision);
    // Only the newest record's: a status kept on an older one is behind what Helm (or
    // anyone) wrote since.
    let status = records.last().and_then(|(summary, annotations)| {
        let text = annotations.get(CLI_STATUS_ANNOTATION)?;
        match serde_json::from_str(text) {
            Ok(status) => Some(status),
            Err(e) => {
                tracing::warn!(record = %summary.name, error = %e, "ignoring an unreadable status annotation");
                None
            }
        }
    });
    Ok(Loaded { records, status })
}

/// A release driven by this command.
pub struct RecordHome {
    client: kube::Client,
    namespace: String,
    release_name: String,
    current: Mutex<SequencedRelease>,
    output: Arc<Output>,
}

impl RecordHome {
    pub fn new(client: kube::Client, release: SequencedRelease, output: Arc<Output>) -> RecordHome {
        RecordHome {
            client,
            namespace: release.metadata.namespace.clone().unwrap_or_default(),
            release_name: release.metadata.name.clone().unwrap_or_default(),
            current: Mutex::new(release),
            output,
        }
    }

    /// The release as last written.
    pub fn current(&self) -> SequencedRelease {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Keeps `release` as the current one, at the next resourceVersion (what the executor
    /// compares to tell a fresher release from the one it read).
    fn keep(&self, mut release: SequencedRelease) -> SequencedRelease {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let version = current
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        release.metadata.resource_version = Some((version + 1).to_string());
        *current = release.clone();
        release
    }

    /// Writes `status` into the record of its revision.
    async fn store(&self, status: &SequencedReleaseStatus) -> Result<(), Error> {
        let Some(revision) = status.revision else {
            return Ok(());
        };
        let name = helm_record_name(&self.release_name, revision);
        let text = serde_json::to_string(status)
            .map_err(|e| Error::Internal(format!("encoding the status of {name}: {e}")))?;
        let patch = json!({"metadata": {"annotations": {
            CLI_STATUS_ANNOTATION: text,
            crate::api::DRIVER_ANNOTATION: crate::api::DRIVER_CLI,
        }}});
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let params = PatchParams {
            field_manager: Some(STATUS_MANAGER.to_string()),
            ..PatchParams::default()
        };
        match secrets.patch(&name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            // Gone with an uninstall: there is nothing to go on from.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(source) => Err(Error::Kube {
                what: format!(
                    "writing the status of {}/{} to its release record {name}",
                    self.namespace, self.release_name
                ),
                source,
            }),
        }
    }
}

impl Home for RecordHome {
    fn replace_status<'a>(
        &'a self,
        _ctx: &'a Context,
        release: &'a SequencedRelease,
    ) -> BoxFuture<'a, Result<Written, Error>> {
        Box::pin(async move {
            let status = release.status.clone().unwrap_or_default();
            self.store(&status).await?;
            let written = self.keep(release.clone());
            self.output.status(&written);
            Ok(Written::Written(Box::new(written)))
        })
    }

    fn set_finalizers<'a>(
        &'a self,
        _ctx: &'a Context,
        release: &'a SequencedRelease,
        finalizers: Vec<String>,
    ) -> BoxFuture<'a, Result<Written, Error>> {
        Box::pin(async move {
            let mut release = release.clone();
            release.metadata.finalizers = Some(finalizers);
            Ok(Written::Written(Box::new(self.keep(release))))
        })
    }

    fn read<'a>(
        &'a self,
        _ctx: &'a Context,
        release: &'a SequencedRelease,
    ) -> BoxFuture<'a, Result<SequencedRelease, Error>> {
        Box::pin(async move {
            // Another command may have gone on since this one read the records (it held the
            // lock this one waited for): its status is where this one goes on from.
            let loaded = load(&self.client, &self.namespace, &self.release_name)
                .await
                .map_err(Error::Internal)?;
            let current = self.current();
            let fresh = loaded.status.filter(|s| release.status.as_ref() != Some(s));
            match fresh {
                Some(status) if current.metadata.deletion_timestamp.is_none() => {
                    let mut release = current;
                    release.status = Some(status);
                    Ok(self.keep(release))
                }
                _ => Ok(current),
            }
        })
    }

    fn tell<'a>(
        &'a self,
        _ctx: &'a Context,
        _release: &'a SequencedRelease,
        note: &'a Note,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.output.note(note);
            Ok(())
        })
    }
}
