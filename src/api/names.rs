//! The product's names on the cluster: the finalizer, labels, annotations, condition types and
//! the names of what the operator keeps next to a release. Every module imports them from here,
//! downward, so that no name is spelt twice.

use std::collections::BTreeMap;

use kube::runtime::reflector::ObjectRef;
use serde_json::Value;

use super::SequencedRelease;

/// The finalizer that makes deleting a SequencedRelease uninstall its chart first.
pub const FINALIZER: &str = "sequenced.dev/finalizer";

/// The label on every object the operator writes (applied objects, Leases, records).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "sequenced";
/// The label selector of everything the operator writes.
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=sequenced";

/// The label on every object a release applies (and on its Lease): the release's shard, a
/// number below `--shards`, so that a replica's watches ask the API server for its shards only.
pub const SHARD_LABEL: &str = "sequenced.dev/shard";
/// The label on the Leases that divide the shards among replicas: `shard` or `member`.
pub const SHARD_LEASE_LABEL: &str = "sequenced.dev/lease";
/// The annotation on a shard Lease giving the number of shards (for `sequenced status`).
pub const SHARDS_ANNOTATION: &str = "sequenced.dev/shards";

/// The shard of the release whose uid is `uid`, of `shards`: the first 8 bytes of the SHA-256 of
/// the uid, modulo `shards` (documented, so that any tool finds a release's shard).
pub fn shard_of(uid: &str, shards: u32) -> u32 {
    use sha2::{Digest as _, Sha256};
    let digest = Sha256::digest(uid.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) % u64::from(shards.max(1))) as u32
}

/// The annotation naming the SequencedRelease (`namespace/name`) an object belongs to.
pub const OWNER_ANNOTATION: &str = "sequenced.dev/owner";
/// The annotation on a release record naming who wrote it, when it is not the operator:
/// [`DRIVER_CLI`] for the command line (`sequenced upgrade`), [`DRIVER_HELM`] for a record Helm
/// wrote that sequenced took over (its [`OWNER_ANNOTATION`] names the release that took it).
/// Records with an owner annotation and without this were written by the operator; records
/// without either, by Helm.
pub const DRIVER_ANNOTATION: &str = "sequenced.dev/driver";
/// The value of [`DRIVER_ANNOTATION`] on the records the command line writes.
pub const DRIVER_CLI: &str = "cli";
/// The value of [`DRIVER_ANNOTATION`] on a record Helm wrote that sequenced took over.
pub const DRIVER_HELM: &str = "helm";

/// The annotation on a release record the command line wrote, holding the status of the
/// release as of that revision (JSON of `SequencedReleaseStatus`: layer progress, the revision
/// being deployed, the history): what the operator keeps in a SequencedRelease's status, so
/// that another command, on another machine, goes on from it.
pub const CLI_STATUS_ANNOTATION: &str = "sequenced.dev/status";

/// The label selector of Helm's records of release `name` (Secrets, or ConfigMaps of Helm's
/// ConfigMap driver): as Helm's storage drivers label them.
pub fn helm_records_selector(name: &str) -> String {
    format!("owner=helm,name={name}")
}

/// Helm's ownership annotations, on every applied object.
pub const RELEASE_NAME_ANNOTATION: &str = "meta.helm.sh/release-name";
pub const RELEASE_NAMESPACE_ANNOTATION: &str = "meta.helm.sh/release-namespace";

/// The field manager of every write.
pub const FIELD_MANAGER: &str = "sequenced";

/// Condition types, with kstatus meanings.
pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";
/// The condition `spec.driftDetection: warn` sets while objects differ from what was applied.
pub const DRIFTED: &str = "Drifted";
/// The condition set while the chart's source serves other bytes under the version the current
/// revision deployed (a version pushed again).
pub const CHART_CHANGED: &str = "ChartChanged";

/// The condition of the last Helm test run, as Flux names it: True when every test passed,
/// False when one failed, Unknown while they run.
pub const TEST_SUCCESS: &str = "TestSuccess";

/// The `status.layers` entry of the CRD stage.
pub const CRD_LAYER: &str = "(crds)";
/// The `status.layers` entry of the prune stage.
pub const PRUNE_LAYER: &str = "(prune)";

/// The `status.layers` entry of the hooks of `event`: `(pre-install)`, `(post-delete)`.
pub fn hook_stage(event: &str) -> String {
    format!("({event})")
}

/// The hook event of Helm's tests, and of their `status.layers` entry (`(test)`).
pub const TEST_EVENT: &str = "test";

/// The annotation on a hook object naming the run that created it:
/// `<release uid>/<revision>/<event>`. An object that carries the current run's value was
/// created by this run (before a takeover, say) and is not created again.
pub const HOOK_RUN_ANNOTATION: &str = "sequenced.dev/hook-run";

/// A reconcile on request (`sequenced reconcile`), as Flux's `reconcile.fluxcd.io/requestedAt`:
/// a new value retries a Stalled or Failed release with the same spec. The value acted on last
/// is `status.lastHandledReconcileAt`.
pub const RECONCILE_REQUEST_ANNOTATION: &str = "reconcile.sequenced.dev/requestedAt";
/// With the same value as [`RECONCILE_REQUEST_ANNOTATION`] (`sequenced reconcile --force`): a
/// Ready release is applied again as a new revision.
pub const FORCE_REQUEST_ANNOTATION: &str = "reconcile.sequenced.dev/forceAt";
/// A rollback on request (`sequenced rollback`): a new value rolls the release back to
/// [`ROLLBACK_REVISION_ANNOTATION`], or to the Ready revision before the current one. The value
/// acted on last is `status.lastHandledRollbackAt`.
pub const ROLLBACK_REQUEST_ANNOTATION: &str = "rollback.sequenced.dev/requestedAt";
/// A Helm test run on request (`sequenced test`): a new value runs the tests of the Ready
/// revision. The value acted on last is `status.lastHandledTestAt`.
pub const TEST_REQUEST_ANNOTATION: &str = "test.sequenced.dev/requestedAt";
/// The revision a rollback on request goes back to.
pub const ROLLBACK_REVISION_ANNOTATION: &str = "rollback.sequenced.dev/revision";

/// The Secret type of release records written before they took Helm's format.
pub const RECORD_TYPE: &str = "sequenced.dev/release.v1";
/// The Secret key that holds an encoded record.
pub const RECORD_KEY: &str = "release";

/// The Secret name of revision `revision` of the SequencedRelease named `release`, as records
/// were named before they took Helm's format (still read, and deleted with the release).
pub fn record_name(release: &str, revision: i64) -> String {
    format!("sequenced.release.v1.{release}.v{revision}")
}

/// The value of [`OWNER_ANNOTATION`] for a release: `namespace/name`.
pub fn owner_value(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The release an object belongs to, read from its [`OWNER_ANNOTATION`].
pub fn owner_of(annotations: &BTreeMap<String, String>) -> Option<ObjectRef<SequencedRelease>> {
    let (namespace, name) = annotations.get(OWNER_ANNOTATION)?.split_once('/')?;
    Some(ObjectRef::new(name).within(namespace))
}

/// What an object's annotations say about who it belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claim {
    /// [`OWNER_ANNOTATION`]: a SequencedRelease, `namespace/name`.
    pub owner: Option<String>,
    /// Helm's release name annotation.
    pub release_name: Option<String>,
    /// Helm's release namespace annotation.
    pub release_namespace: Option<String>,
    /// The finalizers that keep the object while it is being deleted (empty when it is not
    /// being deleted): what an uninstall waiting for it names.
    pub deleting_with: Vec<String>,
}

/// Whose an existing object is, as seen from one release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This release's.
    Us,
    /// No release's: taken over only with `spec.adopt`.
    Nobody,
    /// Another release's, named: `SequencedRelease apps/shop`, `Helm release db in namespace x`.
    Other(String),
}

/// Who a release is, for judging claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `namespace/name` of the SequencedRelease.
    pub owner: String,
    /// The Helm release name.
    pub release_name: String,
    /// The namespace the chart is deployed to.
    pub target_namespace: String,
    /// The SequencedRelease's `metadata.uid`: tells one incarnation of a name from the next.
    pub uid: String,
}

impl Identity {
    /// The identity of `sr`: its `namespace/name`, `releaseName` (default its name) and
    /// `targetNamespace` (default its namespace).
    pub fn of(sr: &SequencedRelease) -> Identity {
        let namespace = sr
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let name = sr.metadata.name.clone().unwrap_or_default();
        Identity {
            owner: owner_value(&namespace, &name),
            release_name: sr.spec.release_name.clone().unwrap_or_else(|| name.clone()),
            target_namespace: sr.spec.target_namespace.clone().unwrap_or(namespace),
            uid: sr.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

impl Claim {
    /// The claim of an object, from its `metadata.annotations`.
    pub fn of(object: &Value) -> Claim {
        let annotation = |key: &str| {
            object
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(key))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        Claim {
            owner: annotation(OWNER_ANNOTATION),
            release_name: annotation(RELEASE_NAME_ANNOTATION),
            release_namespace: annotation(RELEASE_NAMESPACE_ANNOTATION),
            deleting_with: if object.pointer("/metadata/deletionTimestamp").is_some() {
                object
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            } else {
                Vec::new()
            },
        }
    }

    /// Whose the object is for `me`: our owner annotation, or Helm's annotations naming our
    /// release, is ours; another owner annotation or another Helm release is someone else's.
    pub fn judge(&self, me: &Identity) -> Owner {
        if let Some(owner) = &self.owner {
            return if *owner == me.owner {
                Owner::Us
            } else {
                Owner::Other(format!("SequencedRelease {owner}"))
            };
        }
        match (&self.release_name, &self.release_namespace) {
            (Some(name), Some(namespace))
                if *name == me.release_name && *namespace == me.target_namespace =>
            {
                Owner::Us
            }
            (Some(name), namespace) => Owner::Other(format!(
                "Helm release {name} in namespace {}",
                namespace.as_deref().unwrap_or("?")
            )),
            _ => Owner::Nobody,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn me() -> Identity {
        Identity {
            owner: "apps/shop".into(),
            release_name: "shop".into(),
            target_namespace: "apps".into(),
            uid: String::new(),
        }
    }

    fn claim(annotations: Value) -> Owner {
        Claim::of(&json!({"metadata": {"annotations": annotations}})).judge(&me())
    }

    #[test]
    fn claims_are_judged_by_owner_annotation_then_helm_annotations() {
        assert_eq!(claim(json!({OWNER_ANNOTATION: "apps/shop"})), Owner::Us);
        assert_eq!(
            claim(json!({OWNER_ANNOTATION: "apps/other"})),
            Owner::Other("SequencedRelease apps/other".into())
        );
        assert_eq!(
            claim(json!({RELEASE_NAME_ANNOTATION: "shop", RELEASE_NAMESPACE_ANNOTATION: "apps"})),
            Owner::Us
        );
        assert_eq!(
            claim(json!({RELEASE_NAME_ANNOTATION: "db"})),
            Owner::Other("Helm release db in namespace ?".into())
        );
        assert_eq!(claim(json!({})), Owner::Nobody);
        assert_eq!(Claim::of(&json!({})).judge(&me()), Owner::Nobody);
    }

    #[test]
    fn owner_annotations_name_the_release() {
        let annotations = BTreeMap::from([(OWNER_ANNOTATION.to_string(), "apps/shop".to_string())]);
        let release = owner_of(&annotations).unwrap();
        assert_eq!(release.name, "shop");
        assert_eq!(release.namespace.as_deref(), Some("apps"));
        assert!(owner_of(&BTreeMap::new()).is_none());
        assert_eq!(record_name("shop", 3), "sequenced.release.v1.shop.v3");
    }
}
