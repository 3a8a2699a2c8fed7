//! Release records: what each revision deployed, kept in the cluster so that pruning,
//! uninstalling and rolling back work from what was stored, never by guessing or by rendering
//! again, even after a restart.
//!
//! A record is a Secret in Helm's own storage format ([`helm`]), in the SequencedRelease's
//! namespace, so that `helm list`, `helm history` and `helm get` read it; what sequenced keeps
//! beyond Helm's fields (the plan, the inventory, the hooks, whether it was sequenced) travels in
//! the same JSON where Helm ignores it. Records written before (a Secret
//! [`crate::api::record_name`] whose `release` key holds gzip-compressed JSON) are still read.
//! Encoding and decoding are pure; the Secrets are read and written by the controller.

pub mod helm;
pub mod summary;

use std::collections::HashSet;
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::api::PRUNE_LAYER;
use crate::api::{ChartArtifact, CrdPolicy, InventoryEntry, ObjectKey, TestPhase, TestStatus};
use crate::plan::{ExternalDependency, Hook, Plan};

pub use helm::HelmStatus;
pub use summary::{RecordSummary, Sightings, Writer};

/// Records larger than this, decompressed, are refused (a Secret holds at most 1 MiB compressed).
const MAX_DECODED: u64 = 64 * 1024 * 1024;

/// One uninstall step of a revision: its objects in delete order, and the steps whose objects
/// must be gone first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryStep {
    pub chart: String,
    pub name: String,
    pub objects: Vec<ObjectKey>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<usize>,
}

/// Everything a revision applies (CRDs aside: they are never deleted), in uninstall order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    pub steps: Vec<InventoryStep>,
}

impl Inventory {
    /// The plan's uninstall steps, with each resource's namespace as `namespace_of` resolves it;
    /// a resource annotated `helm.sh/resource-policy: keep` is left out (never pruned nor
    /// uninstalled, as Helm keeps it).
    pub fn from_plan(plan: &Plan, namespace_of: impl Fn(usize) -> Option<String>) -> Inventory {
        let steps = plan
            .uninstall
            .iter()
            .map(|step| InventoryStep {
                chart: step.chart.clone(),
                name: step.name.clone(),
                objects: step
                    .resources
                    .iter()
                    .filter_map(|&i| {
                        let r = plan.resources.get(i)?;
                        // `helm.sh/resource-policy: keep`: Helm neither prunes nor uninstalls it.
                        let keep = r
                            .object
                            .pointer("/metadata/annotations/helm.sh~1resource-policy")
                            .and_then(serde_json::Value::as_str)
                            == Some("keep");
                        if keep {
                            return None;
                        }
                        Some(ObjectKey {
                            api_version: r.api_version.clone(),
                            kind: r.kind.clone(),
                            namespace: namespace_of(i),
                            name: r.name.clone(),
                        })
                    })
                    .collect(),
                after: step.after.clone(),
            })
            .collect();
        Inventory { steps }
    }

    /// Every object, in uninstall order.
    pub fn objects(&self) -> impl Iterator<Item = &ObjectKey> {
        self.steps.iter().flat_map(|s| s.objects.iter())
    }

    /// The objects of this inventory that `next` no longer has, in this inventory's uninstall
    /// order (the reverse of its plan): what an upgrade to `next` prunes. Objects are compared
    /// by [`ObjectKey::identity`], so an object `next` serves through another version (a
    /// HorizontalPodAutoscaler moved from `autoscaling/v1` to `/v2`) is kept, not pruned.
    pub fn removed_in(&self, next: &Inventory) -> Vec<ObjectKey> {
        let kept: HashSet<_> = next.objects().map(ObjectKey::identity).collect();
        self.objects()
            .filter(|o| !kept.contains(&o.identity()))
            .cloned()
            .collect()
    }
}

impl Inventory {
    /// What a release Helm wrote deployed (the objects of its manifest, each with its
    /// namespace resolved): one step, in Helm's uninstall order of kinds, the objects of one kind
    /// in the manifest's order. What the first revision that goes on from it prunes against.
    pub fn of_helm(chart: &str, mut objects: Vec<ObjectKey>) -> Inventory {
        use crate::plan::kind_order::{Direction, compare};
        objects.sort_by(|a, b| compare(&a.kind, &b.kind, Direction::Uninstall));
        Inventory {
            steps: vec![InventoryStep {
                chart: chart.to_string(),
                name: "(helm)".to_string(),
                objects,
                after: Vec::new(),
            }],
        }
    }

    /// The objects outside `namespace` (cluster-scoped, or in another namespace), in uninstall
    /// order with their layers: what `status.inventory` keeps.
    pub fn outside(&self, namespace: &str) -> Vec<InventoryEntry> {
        self.steps
            .iter()
            .flat_map(|step| {
                step.objects
                    .iter()
                    .filter(|o| o.namespace.as_deref() != Some(namespace))
                    .map(|o| InventoryEntry {
                        api_version: o.api_version.clone(),
                        kind: o.kind.clone(),
                        namespace: o.namespace.clone(),
                        name: o.name.clone(),
                        chart: step.chart.clone(),
                        layer: step.name.clone(),
                    })
            })
            .collect()
    }

    /// The uninstall of what `status.inventory` kept: its layers in order, each after the one
    /// before it.
    pub fn from_entries(entries: &[InventoryEntry]) -> Inventory {
        let mut steps: Vec<InventoryStep> = Vec::new();
        for entry in entries {
            let key = ObjectKey {
                api_version: entry.api_version.clone(),
                kind: entry.kind.clone(),
                namespace: entry.namespace.clone(),
                name: entry.name.clone(),
            };
            match steps.last_mut() {
                Some(step) if step.chart == entry.chart && step.name == entry.layer => {
                    step.objects.push(key);
                }
                _ => {
                    let after = steps.len().checked_sub(1).into_iter().collect();
                    steps.push(InventoryStep {
                        chart: entry.chart.clone(),
                        name: entry.layer.clone(),
                        objects: vec![key],
                        after,
                    });
                }
            }
        }
        Inventory { steps }
    }
}

/// A Helm hook of a revision: not a release resource (never pruned or uninstalled with the
/// layers), kept apart with the object itself, so that its delete and rollback hooks can run
/// from the record when the chart is gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookRecord {
    pub key: ObjectKey,
    /// The chart path and file it came from.
    pub chart: String,
    pub template: String,
    /// `pre-install`, `post-delete`, ... as written in `helm.sh/hook`.
    pub events: Vec<String>,
    pub weight: i64,
    pub delete_policies: Vec<String>,
    /// `helm.sh/hook-output-log-policy` (records written before it have none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_log_policies: Vec<String>,
    /// The object as rendered (without the operator's labels and annotations).
    pub object: serde_json::Value,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external: Vec<ExternalDependency>,
}

impl HookRecord {
    /// A planned hook, with its identity resolved against the cluster.
    pub fn of(hook: &Hook, key: ObjectKey) -> HookRecord {
        HookRecord {
            key,
            chart: hook.resource.chart.clone(),
            template: hook.resource.template.clone(),
            events: hook.events.clone(),
            weight: hook.weight,
            delete_policies: hook.delete_policies.clone(),
            output_log_policies: hook.output_log_policies.clone(),
            object: hook.resource.object.clone(),
            external: hook.external.clone(),
        }
    }

    /// Whether it runs at `event`.
    pub fn runs_at(&self, event: &str) -> bool {
        self.events.iter().any(|e| e == event)
    }

    /// Whether `helm.sh/hook-delete-policy` has `policy`.
    pub fn has_policy(&self, policy: &str) -> bool {
        self.delete_policies.iter().any(|p| p == policy)
    }

    /// Whether `helm.sh/hook-output-log-policy` has `policy`.
    pub fn has_output_log_policy(&self, policy: &str) -> bool {
        self.output_log_policies.iter().any(|p| p == policy)
    }

    /// Whether a delete policy may delete it: never a CustomResourceDefinition, whose deletion
    /// would take every object of its kind with it (Helm's `deleteHookByPolicy`).
    pub fn deletable(&self) -> bool {
        self.key.kind != "CustomResourceDefinition"
    }

    /// Whether it runs to completion and has a log: a Job or a Pod (of the core group and
    /// `batch`), as Helm waits on them and prints their logs.
    pub fn runs_to_completion(&self) -> bool {
        matches!(
            (
                crate::plan::api_group(&self.key.api_version),
                self.key.kind.as_str()
            ),
            ("batch", "Job") | ("", "Pod")
        )
    }

    /// `Job/migrate (chart shop, templates/migrate.yaml)`, as messages name a hook.
    pub fn label(&self) -> String {
        format!(
            "{}/{} (chart {}, {})",
            self.key.kind, self.key.name, self.chart, self.template
        )
    }
}

/// What Helm's readers show of a revision: the chart's metadata, the user's values and the
/// rendered manifest.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Content {
    /// Chart.yaml of the top chart.
    pub chart_metadata: Map<String, Value>,
    /// The values the user gave (`helm get values`): `valuesFrom` and `values`, merged.
    pub values: Map<String, Value>,
    /// The main resources as Helm rendered them (`helm get manifest`), hooks and CRDs aside.
    pub manifest: String,
}

/// Where a revision stands, as Helm says it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Info {
    pub status: HelmStatus,
    pub description: String,
    /// RFC 3339.
    pub first_deployed: String,
    pub last_deployed: String,
}

/// The plan a revision applied, with every object's identity: what a rollback to it applies
/// again, in its order, without the chart (which may be gone or changed since).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredPlan {
    /// The plan without its hooks (the record keeps them resolved, [`Record::hooks`]) and
    /// warnings.
    pub plan: Plan,
    /// By index into `plan.resources`.
    pub keys: Vec<ObjectKey>,
    /// By index into `plan.crds`.
    pub crd_keys: Vec<ObjectKey>,
}

/// What one revision deployed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub revision: i64,
    pub digest: String,
    pub chart: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart_version: Option<String>,
    /// The archive the revision deployed (its digests); absent in records written before they
    /// were kept, and for a chart directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart_artifact: Option<ChartArtifact>,
    pub sequenced: bool,
    pub inventory: Inventory,
    /// Objects of the revision before that this one no longer has, in delete order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prune: Vec<ObjectKey>,
    /// The revision's hooks, in run order (records written before hooks ran have none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookRecord>,
    /// Whether the revision is an upgrade (an earlier one was Ready); absent in records written
    /// before this was kept, where any revision after the first counts as one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<bool>,
    /// What the revision does with the charts' CRDs: `spec.crds` resolved when it began (`Skip`
    /// for a rollback); absent in records written before it was kept, where the revision
    /// creates the CRDs that do not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crds: Option<CrdPolicy>,
    /// What a rollback to this revision applies; absent in records written before rollbacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<StoredPlan>,
    /// For a rollback, the revision whose plan it applies again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_to: Option<i64>,
    /// The first revision that went on from a history sequenced did not write (a Helm
    /// release's): the record of that history it upgrades (`deployed` until this one is, then
    /// `superseded`), and the revision that history ended at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub went_on_from: Option<WentOnFrom>,
    /// The last run of the revision's Helm tests: what `helm status` prints of its test hooks
    /// (`TEST SUITE`, `Last Started`, `Last Completed`, `Phase`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tests: Vec<TestStatus>,
    /// Helm's fields: kept in the record where Helm reads them, not in sequenced's part.
    #[serde(skip)]
    pub content: Content,
    #[serde(skip)]
    pub info: Info,
}

/// Where a first revision of sequenced's went on from ([`Record::went_on_from`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WentOnFrom {
    /// Whose history it was: `helm`, or the SequencedRelease (`namespace/name`) that wrote it
    /// and no longer exists.
    pub origin: String,
    /// The newest revision of that history.
    pub last: i64,
    /// The record it upgrades (its manifest is what it prunes against), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<i64>,
    /// A pending record it took over (marked `failed`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub took_pending: Option<i64>,
}

/// A record that cannot be read back.
#[derive(Debug, thiserror::Error)]
#[error("release record {name}: {message}")]
pub struct RecordError {
    pub name: String,
    pub message: String,
}

impl Record {
    /// Whether the revision is an upgrade, running the upgrade hooks.
    pub fn is_upgrade(&self) -> bool {
        self.upgrade.unwrap_or(self.revision > 1)
    }

    /// What an uninstall deletes: the objects this revision was still pruning first, then the
    /// revision's own inventory.
    pub fn uninstall_inventory(&self) -> Inventory {
        let mut steps = Vec::with_capacity(self.inventory.steps.len() + 1);
        let offset = usize::from(!self.prune.is_empty());
        if !self.prune.is_empty() {
            steps.push(InventoryStep {
                chart: self.chart.clone(),
                name: PRUNE_LAYER.to_string(),
                objects: self.prune.clone(),
                after: Vec::new(),
            });
        }
        steps.extend(self.inventory.steps.iter().map(|s| InventoryStep {
            after: s.after.iter().map(|a| a + offset).collect(),
            ..s.clone()
        }));
        Inventory { steps }
    }

    /// The record in Helm's format, as release `name` in `namespace`.
    pub fn to_helm(&self, name: &str, namespace: &str) -> helm::HelmRelease {
        let sequenced = serde_json::to_value(self).ok();
        helm::HelmRelease {
            name: name.to_string(),
            namespace: namespace.to_string(),
            version: self.revision,
            info: helm::HelmInfo {
                first_deployed: self.info.first_deployed.clone(),
                last_deployed: self.info.last_deployed.clone(),
                deleted: String::new(),
                description: self.info.description.clone(),
                status: self.info.status,
                notes: String::new(),
            },
            chart: helm::HelmChart {
                metadata: self.content.chart_metadata.clone(),
                values: Map::new(),
                templates: Vec::new(),
                files: Vec::new(),
            },
            config: self.content.values.clone(),
            manifest: self.content.manifest.clone(),
            hooks: self.helm_test_hooks(),
            sequenced,
        }
    }

    /// The revision's test hooks as Helm keeps hooks in a release (`helm get hooks`), each with
    /// its last run from [`Record::tests`] (never run: Helm's zero time, which `helm status`
    /// skips). The other hooks are not written for Helm: only the test runs are something
    /// Helm's readers show.
    fn helm_test_hooks(&self) -> Vec<Value> {
        const NEVER: &str = "0001-01-01T00:00:00Z";
        self.hooks
            .iter()
            .filter(|h| h.events.iter().any(|e| crate::plan::is_test_event(e)))
            .map(|hook| {
                let run = self.tests.iter().find(|t| t.name == hook.key.name);
                let time = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
                    t.map_or_else(|| NEVER.to_string(), |t| t.0.to_string())
                };
                let phase = match run.map(|r| r.phase) {
                    None => "Unknown",
                    Some(TestPhase::Running) => "Running",
                    Some(TestPhase::Succeeded) => "Succeeded",
                    Some(TestPhase::Failed) => "Failed",
                };
                serde_json::json!({
                    "name": hook.key.name,
                    "kind": hook.key.kind,
                    "path": format!("{}/{}", hook.chart, hook.template),
                    "manifest": serde_json::to_string(&hook.object).unwrap_or_default(),
                    // As Helm stores them: Helm 2's `test-success` is `test`.
                    "events": hook
                        .events
                        .iter()
                        .map(|e| if crate::plan::is_test_event(e) { crate::api::TEST_EVENT } else { e.as_str() })
                        .collect::<Vec<_>>(),
                    "last_run": {
                        "started_at": time(run.and_then(|r| r.started_at.as_ref())),
                        "completed_at": time(run.and_then(|r| r.finished_at.as_ref())),
                        "phase": phase,
                    },
                    "weight": hook.weight,
                    "delete_policies": hook.delete_policies,
                })
            })
            .collect()
    }

    /// Reads a record in Helm's format; `name` is the Secret, for the error. A release Helm
    /// itself wrote (without sequenced's part) is not one of ours.
    pub fn from_helm(name: &str, release: helm::HelmRelease) -> Result<Record, RecordError> {
        let error = |message: String| RecordError {
            name: name.to_string(),
            message,
        };
        let part = release
            .sequenced
            .ok_or_else(|| error("written by Helm, not by sequenced".to_string()))?;
        let mut record: Record = serde_json::from_value(part)
            .map_err(|e| error(format!("not a sequenced release record: {e}")))?;
        record.content = Content {
            chart_metadata: release.chart.metadata,
            values: release.config,
            manifest: release.manifest,
        };
        record.info = Info {
            status: release.info.status,
            description: release.info.description,
            first_deployed: release.info.first_deployed,
            last_deployed: release.info.last_deployed,
        };
        Ok(record)
    }

    /// Gzip-compressed JSON, the format before records took Helm's.
    pub fn encode(&self) -> Vec<u8> {
        gzip_json(self)
    }

    /// Reads what [`Record::encode`] wrote; `name` is the Secret, for the error. Helm's part is
    /// empty, its status unknown.
    pub fn decode(name: &str, bytes: &[u8]) -> Result<Record, RecordError> {
        let error = |message: String| RecordError {
            name: name.to_string(),
            message,
        };
        gunzip_json(bytes).map_err(|e| {
            error(match e {
                Unzipped::NotGzip(e) => format!("not gzip: {e}"),
                Unzipped::NotJson(e) => format!("not a release record: {e}"),
            })
        })
    }
}

/// `value` as gzip-compressed JSON.
pub fn gzip_json<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let json = serde_json::to_vec(value).unwrap_or_default();
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(&json);
    encoder.finish().unwrap_or_default()
}

/// Why [`gunzip_json`] failed.
#[derive(Debug)]
pub enum Unzipped {
    NotGzip(std::io::Error),
    NotJson(serde_json::Error),
}

/// What [`gzip_json`] wrote (at most 64 MiB of JSON).
pub fn gunzip_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Unzipped> {
    let json = gunzip(bytes).map_err(Unzipped::NotGzip)?;
    serde_json::from_slice(&json).map_err(Unzipped::NotJson)
}

/// The gzip `bytes` decompressed, at most 64 MiB of them.
pub fn gunzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .take(MAX_DECODED)
        .read_to_end(&mut plain)?;
    Ok(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: &str, name: &str) -> ObjectKey {
        ObjectKey {
            api_version: "v1".into(),
            kind: kind.into(),
            namespace: Some("ns".into()),
            name: name.into(),
        }
    }

    #[test]
    fn records_round_trip_and_garbage_is_an_error() {
        let record = Record {
            revision: 3,
            digest: "sha256:ab".into(),
            chart: "shop".into(),
            chart_version: Some("1.0.0".into()),
            chart_artifact: None,
            sequenced: true,
            inventory: Inventory {
                steps: vec![InventoryStep {
                    chart: "shop".into(),
                    name: "app".into(),
                    objects: vec![key("Service", "a")],
                    after: vec![],
                }],
            },
            prune: vec![key("ConfigMap", "old")],
            hooks: vec![HookRecord {
                key: key("Job", "migrate"),
                chart: "shop".into(),
                template: "templates/migrate.yaml".into(),
                events: vec!["pre-install".into(), "pre-delete".into()],
                weight: -1,
                delete_policies: vec!["hook-succeeded".into()],
                output_log_policies: vec![],
                object: serde_json::json!({"kind": "Job"}),
                external: vec![],
            }],
            upgrade: Some(false),
            crds: Some(CrdPolicy::CreateReplace),
            plan: None,
            rollback_to: None,
            went_on_from: None,
            tests: Vec::new(),
            content: Content::default(),
            info: Info::default(),
        };
        assert_eq!(Record::decode("s", &record.encode()).unwrap(), record);
        // In Helm's format, Helm's fields go where Helm reads them.
        let mut helm_record = record.clone();
        helm_record.content.manifest = "---\nkind: ConfigMap\n".into();
        helm_record.info.status = HelmStatus::Deployed;
        let helm = helm_record.to_helm("shop", "apps");
        assert_eq!(helm.manifest, "---\nkind: ConfigMap\n");
        assert!(helm.sequenced.as_ref().unwrap().get("manifest").is_none());
        let decoded = helm::HelmRelease::decode("s", helm.encode().as_bytes()).unwrap();
        assert_eq!(Record::from_helm("s", decoded).unwrap(), helm_record);
        let mut foreign = helm;
        foreign.sequenced = None;
        let err = Record::from_helm("sh.helm.release.v1.shop.v3", foreign).unwrap_err();
        assert!(err.to_string().contains("written by Helm"), "{err}");
        let err = Record::decode("s", b"nope").unwrap_err();
        assert!(
            err.to_string().starts_with("release record s: not gzip"),
            "{err}"
        );
    }

    #[test]
    fn records_written_before_hooks_still_read() {
        let old = serde_json::json!({
            "revision": 1, "digest": "sha256:ab", "chart": "shop", "sequenced": true,
            "inventory": {"steps": []},
        });
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(old.to_string().as_bytes()).unwrap();
        let record = Record::decode("s", &encoder.finish().unwrap()).unwrap();
        assert!(record.hooks.is_empty());
        assert_eq!(record.revision, 1);
    }

    /// One step `c`/`l` of these objects.
    fn step(objects: Vec<ObjectKey>) -> InventoryStep {
        InventoryStep {
            chart: "c".into(),
            name: "l".into(),
            objects,
            after: vec![],
        }
    }

    #[test]
    fn pruning_keeps_the_old_uninstall_order_and_drops_what_stays() {
        let old = Inventory {
            steps: vec![
                step(vec![key("Deployment", "app"), key("Service", "app")]),
                step(vec![key("Deployment", "db")]),
            ],
        };
        let new = Inventory {
            steps: vec![step(vec![key("Service", "app")])],
        };
        assert_eq!(
            old.removed_in(&new),
            vec![key("Deployment", "app"), key("Deployment", "db")]
        );
    }

    #[test]
    fn pruning_compares_identity_not_the_served_version() {
        let at = |api_version: &str, kind: &str, name: &str| ObjectKey {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: Some("ns".into()),
            name: name.into(),
        };
        let old = Inventory {
            steps: vec![step(vec![
                at("autoscaling/v1", "HorizontalPodAutoscaler", "web"),
                at("policy/v1beta1", "PodDisruptionBudget", "web"),
            ])],
        };
        let new = Inventory {
            steps: vec![step(vec![
                at("autoscaling/v2", "HorizontalPodAutoscaler", "web"),
                at("v1", "PodDisruptionBudget", "web"),
            ])],
        };
        // The HPA is one object served at two versions; a PodDisruptionBudget of the core group
        // would be another object than the policy one.
        assert_eq!(
            old.removed_in(&new),
            vec![at("policy/v1beta1", "PodDisruptionBudget", "web")]
        );
    }
}
