//! The plan cache: each release's chart is rendered and planned once per digest (and per
//! install or upgrade), with the cluster's version and API versions, and every planned object's
//! identity is resolved against the cluster's discovery.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::ObjectRef;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::Error;
use super::source::Prepared;
use crate::api::{ObjectKey, Reason, SequencedRelease};
use crate::cluster::{Cluster, ClusterError};
use crate::helm::Helm;
use crate::history::{HookRecord, Inventory, gunzip_json, gzip_json};
use crate::kubectl::Kubectl;
use crate::metrics::Metrics;
use crate::pipeline::{self, RenderRequest};
use crate::plan::{Plan, Resource};
use crate::readiness;
use crate::rollout::Deployable;
use crate::rollout::lifecycle::{PlanFact, Refusal};

/// The last plan of each release.
pub struct Plans {
    cached: Mutex<HashMap<ObjectRef<SequencedRelease>, Cached>>,
    /// Renders at once, shared fairly between namespaces.
    rendering: Renders,
    /// `helm template` timeouts in a row, by release.
    timeouts: super::TimeoutStreaks,
}

impl Default for Plans {
    fn default() -> Plans {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        Plans {
            cached: Mutex::default(),
            rendering: Renders::new(cores),
            timeouts: super::TimeoutStreaks::default(),
        }
    }
}

/// The render permits, shared fairly between namespaces. `helm template` is CPU-bound (about
/// 50 ms a chart): one namespace may render on every core at once (as many permits as the machine
/// has cores), and one permit more is kept for the others, so one tenant's slow charts never hold
/// every render while a cluster of one team still renders on every core. The queue for the shared
/// permits holds at most a core's count of renders of each namespace (the others wait on their
/// namespace's own permits), so another tenant's render waits for at most one render of each busy
/// namespace.
pub struct Renders {
    all: tokio::sync::Semaphore,
    share: usize,
    namespaces: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl Renders {
    pub fn new(cores: usize) -> Renders {
        let cores = cores.max(1);
        Renders {
            all: tokio::sync::Semaphore::new(cores + 1),
            share: cores,
            namespaces: Mutex::default(),
        }
    }

    /// Waits for a render permit for a release of `namespace`.
    pub async fn acquire(
        &self,
        namespace: &str,
    ) -> (
        tokio::sync::OwnedSemaphorePermit,
        tokio::sync::SemaphorePermit<'_>,
    ) {
        let own = {
            let mut namespaces = self.namespaces.lock().unwrap_or_else(|e| e.into_inner());
            // Namespaces no render holds or waits for are forgotten.
            let share = self.share;
            namespaces.retain(|_, s| Arc::strong_count(s) > 1 || s.available_permits() < share);
            Arc::clone(
                namespaces
                    .entry(namespace.to_string())
                    .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(share))),
            )
        };
        let own = own
            .acquire_owned()
            .await
            .expect("render permits are never closed");
        let all = self
            .all
            .acquire()
            .await
            .expect("render permits are never closed");
        (own, all)
    }
}

/// A cached plan; a slim one (see [`Plans::slim`]) with what it was cut of, packed.
struct Cached {
    fact: PlanFact,
    packed: Option<Arc<[u8]>>,
}

/// What a slim plan was cut of: every main resource's object and the content, as gzip JSON.
#[derive(Serialize, Deserialize)]
struct Packed {
    objects: Vec<Value>,
    chart_metadata: Map<String, Value>,
    values: Map<String, Value>,
    manifest: String,
}

impl Plans {
    pub fn forget(&self, release: &ObjectRef<SequencedRelease>) {
        if let Ok(mut cached) = self.cached.lock() {
            cached.remove(release);
        }
        self.timeouts.ended(release);
    }

    /// Keeps of the release's plan what observing and judging its objects needs (their
    /// identity, layers and readiness annotations), and the rest packed (a few KB instead of the rendered objects):
    /// for a Ready release, whose plan is needed whole again only to apply, compare or record
    /// it. [`Plans::get`] unpacks it when asked for the whole plan; the chart is not rendered
    /// again.
    pub fn slim(&self, release: &ObjectRef<SequencedRelease>) {
        let Ok(mut cached) = self.cached.lock() else {
            return;
        };
        let Some(entry) = cached.get_mut(release) else {
            return;
        };
        let whole = match &entry.fact.outcome {
            Ok(deployable) if !deployable.slim => Arc::clone(deployable),
            _ => return,
        };
        let packed = Packed {
            objects: whole
                .plan
                .resources
                .iter()
                .map(|r| r.object.clone())
                .collect(),
            chart_metadata: whole.content.chart_metadata.clone(),
            values: whole.content.values.clone(),
            manifest: whole.content.manifest.clone(),
        };
        let plan = &whole.plan;
        let slim = Deployable {
            plan: Plan {
                resources: plan
                    .resources
                    .iter()
                    .map(|r| Resource {
                        chart: r.chart.clone(),
                        template: r.template.clone(),
                        api_version: r.api_version.clone(),
                        kind: r.kind.clone(),
                        name: r.name.clone(),
                        namespace: r.namespace.clone(),
                        object: readiness::rules_only(&r.object),
                        gate: r.gate,
                    })
                    .collect(),
                chart: plan.chart.clone(),
                crds: plan.crds.clone(),
                hooks: plan.hooks.clone(),
                layers: plan.layers.clone(),
                charts: plan.charts.clone(),
                uninstall: plan.uninstall.clone(),
                warnings: plan.warnings.clone(),
            },
            chart_version: whole.chart_version.clone(),
            keys: whole.keys.clone(),
            crd_keys: whole.crd_keys.clone(),
            hooks: whole.hooks.clone(),
            inventory: whole.inventory.clone(),
            content: Default::default(),
            slim: true,
            rules: Arc::clone(&whole.rules),
        };
        entry.packed = Some(Arc::from(gzip_json(&packed)));
        entry.fact.outcome = Ok(Arc::new(slim));
    }

    /// The plan for this digest, from the cache or rendered now; `whole` unpacks a slim one. A
    /// failure that trying again may fix (a helm that did not start, discovery) is an error and
    /// is not cached; a chart that does not render or plan is a refusal, cached with its digest.
    #[allow(clippy::too_many_arguments)]
    pub async fn get(
        &self,
        release: &ObjectRef<SequencedRelease>,
        prepared: &Prepared,
        is_upgrade: bool,
        whole: bool,
        cluster: &Cluster,
        helm: &Helm,
        kubectl: &Kubectl,
        metrics: &Metrics,
    ) -> Result<PlanFact, Error> {
        if let Some(fact) = self.cached(release, &prepared.digests.current, is_upgrade, whole) {
            return Ok(fact);
        }
        let (kube_version, api_versions) = cluster.capabilities().await?;
        let request = RenderRequest {
            release_name: prepared.release_name.clone(),
            namespace: prepared.namespace.clone(),
            values: prepared.values.clone(),
            flags: prepared.flags.clone(),
            kube_version,
            api_versions,
            is_upgrade,
        };
        let digest = &prepared.digests.current;
        if let Some(refusal) = self.timeouts.stalled(release, digest, "helm template") {
            return Ok(PlanFact {
                digest: digest.clone(),
                is_upgrade,
                outcome: Err(refusal),
            });
        }
        let namespace = release.namespace.as_deref().unwrap_or("default");
        let permit = self.rendering.acquire(namespace).await;
        let rendering = std::time::Instant::now();
        let values = prepared.values.clone();
        let common = prepared.common_metadata.clone();
        let rendered = match pipeline::render(helm, &prepared.resolved, &request).await {
            Ok(rendered) => {
                pipeline::post_render(kubectl, rendered, &prepared.post_renderers).await
            }
            Err(e) => Err(e),
        };
        let planned = match rendered {
            Ok(mut rendered) => tokio::task::spawn_blocking(move || {
                if let Some(common) = &common {
                    rendered.documents.stamp(common);
                }
                let content = pipeline::content(&rendered, &values);
                pipeline::plan(rendered).map(|plan| (plan, content))
            })
            .await
            .unwrap_or_else(|e| {
                Err(pipeline::Error::Io {
                    what: "planning".to_string(),
                    message: format!("stopped: {e}"),
                })
            }),
            Err(e) => Err(e),
        };
        drop(permit);
        metrics
            .render_duration
            .observe(rendering.elapsed().as_secs_f64());
        // A refusal that installing a CRD can lift is not kept: the next reconcile plans again.
        let mut keep = true;
        let outcome = match planned {
            Ok((plan, content)) => {
                let version = prepared.resolved.version.clone();
                let (mut deployable, unserved) =
                    deployable(plan, version, cluster, &prepared.namespace).await?;
                deployable.content = content;
                let refusal = match unserved_kinds(&unserved) {
                    Some(refusal) => Some(refusal),
                    None => unknown_external(&deployable, cluster).await?,
                };
                match refusal {
                    Some(refusal) => {
                        keep = false;
                        Err(refusal)
                    }
                    None => Ok(Arc::new(deployable)),
                }
            }
            Err(e) if e.timed_out() => {
                keep = false;
                match self.timeouts.timed_out(release, digest, "helm template") {
                    Some(refusal) => Err(refusal),
                    None => return Err(e.into()),
                }
            }
            Err(e) if e.is_transient() => return Err(e.into()),
            Err(e) => Err(super::source::refusal_of(&e)),
        };
        if outcome.is_ok() {
            self.timeouts.ended(release);
        }
        let fact = PlanFact {
            digest: prepared.digests.current.clone(),
            is_upgrade,
            outcome,
        };
        if keep && let Ok(mut cached) = self.cached.lock() {
            let entry = Cached {
                fact: fact.clone(),
                packed: None,
            };
            cached.insert(release.clone(), entry);
        }
        Ok(fact)
    }

    /// The cached plan of this digest, unpacked when `whole` is asked for and it is slim; None
    /// when there is none (or it cannot be unpacked, which is then logged).
    fn cached(
        &self,
        release: &ObjectRef<SequencedRelease>,
        digest: &str,
        is_upgrade: bool,
        whole: bool,
    ) -> Option<PlanFact> {
        let mut cached = self.cached.lock().ok()?;
        let entry = cached
            .get_mut(release)
            .filter(|e| e.fact.digest == digest && e.fact.is_upgrade == is_upgrade)?;
        let (Some(packed), true) = (&entry.packed, whole) else {
            return Some(entry.fact.clone());
        };
        let Ok(slim) = &entry.fact.outcome else {
            return Some(entry.fact.clone());
        };
        let packed: Packed = match gunzip_json(packed) {
            Ok(packed) => packed,
            Err(e) => {
                tracing::warn!(release = %release, error = ?e, "unpacking a cached plan; rendering it again");
                cached.remove(release);
                return None;
            }
        };
        let mut unpacked = Deployable {
            slim: false,
            ..(**slim).clone()
        };
        for (resource, object) in unpacked.plan.resources.iter_mut().zip(packed.objects) {
            resource.object = object;
        }
        unpacked.content.chart_metadata = packed.chart_metadata;
        unpacked.content.values = packed.values;
        unpacked.content.manifest = packed.manifest;
        entry.fact.outcome = Ok(Arc::new(unpacked));
        entry.packed = None;
        Some(entry.fact.clone())
    }
}

/// The first external dependency (werf's `<id>.external-dependency.werf.io/resource`) whose kind
/// neither the API server (after discovery is read again) nor the chart's own CRDs serve: a plan
/// error naming the annotation, rather than a wait for an object that can never be found.
async fn unknown_external(
    deployable: &Deployable,
    cluster: &Cluster,
) -> Result<Option<Refusal>, Error> {
    let crd_names: Vec<(String, Vec<String>)> = deployable
        .plan
        .crds
        .iter()
        .filter_map(|crd| {
            let spec = crd.object.get("spec")?;
            let group = spec.get("group")?.as_str()?.to_ascii_lowercase();
            let names = spec.get("names")?;
            let mut all: Vec<String> = ["kind", "plural", "singular"]
                .iter()
                .filter_map(|k| names.get(*k)?.as_str())
                .chain(
                    names
                        .get("shortNames")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str),
                )
                .map(str::to_ascii_lowercase)
                .collect();
            all.dedup();
            Some((group, all))
        })
        .collect();
    let plan = &deployable.plan;
    let externals = plan
        .layers
        .iter()
        .flat_map(|l| l.external.iter())
        .chain(deployable.hooks.iter().flat_map(|h| h.external.iter()));
    for external in externals {
        match cluster
            .resolve(&external.kind, external.group.as_deref())
            .await
        {
            Ok(_) => continue,
            Err(ClusterError::UnknownKind { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let kind = external.kind.to_ascii_lowercase();
        let group = external.group.as_deref().map(str::to_ascii_lowercase);
        let from_chart = crd_names
            .iter()
            .any(|(g, names)| names.contains(&kind) && group.as_ref().is_none_or(|want| want == g));
        if from_chart {
            continue;
        }
        let spelled = match &external.group {
            Some(g) => format!("{}.{g}", external.kind),
            None => external.kind.clone(),
        };
        return Ok(Some(Refusal {
            reason: Reason::PlanFailed,
            message: format!(
                "annotation {}{} of {} ({}): the API server serves no resource {spelled:?} (a kind, plural, singular or short name, with an optional .group), nor do the chart's CRDs",
                external.id,
                crate::plan::annotations::WERF_EXTERNAL_RESOURCE,
                external.declared_by,
                external.template,
            ),
        }));
    }
    Ok(None)
}

/// Gives every planned object its namespace, as the cluster scopes its kind (a kind the cluster
/// does not serve yet is scoped as the chart's CRDs say, else namespaced). Also returns the
/// objects (main resources and hooks) of kinds that neither the cluster nor a CRD of the chart
/// serves; a kind of an API group the cluster cannot list now is an error (waited for).
async fn deployable(
    plan: Plan,
    version: Option<String>,
    cluster: &Cluster,
    target_namespace: &str,
) -> Result<(Deployable, Vec<Resource>), Error> {
    let crd_scopes: HashMap<(String, String), bool> = plan
        .crds
        .iter()
        .chain(&plan.resources)
        .chain(plan.hooks.iter().map(|h| &h.resource))
        .filter(|r| r.kind == "CustomResourceDefinition")
        .filter_map(|crd| {
            let spec = crd.object.get("spec")?;
            let group = spec.get("group")?.as_str()?;
            let kind = spec.pointer("/names/kind")?.as_str()?;
            let namespaced = spec.get("scope").and_then(Value::as_str) != Some("Cluster");
            Some(
                spec.get("versions")?
                    .as_array()?
                    .iter()
                    .filter_map(|v| v.get("name")?.as_str())
                    .map(|v| ((format!("{group}/{v}"), kind.to_string()), namespaced))
                    .collect::<Vec<_>>(),
            )
        })
        .flatten()
        .collect();
    let mut unserved = Vec::new();
    let mut keys = Vec::with_capacity(plan.resources.len());
    for resource in &plan.resources {
        keys.push(
            key_of(
                resource,
                cluster,
                &crd_scopes,
                target_namespace,
                &mut unserved,
            )
            .await?,
        );
    }
    let mut hooks = Vec::with_capacity(plan.hooks.len());
    for hook in &plan.hooks {
        let key = key_of(
            &hook.resource,
            cluster,
            &crd_scopes,
            target_namespace,
            &mut unserved,
        )
        .await?;
        hooks.push(HookRecord::of(hook, key));
    }
    let crd_keys = plan
        .crds
        .iter()
        .map(|crd| ObjectKey {
            api_version: crd.api_version.clone(),
            kind: crd.kind.clone(),
            namespace: None,
            name: crd.name.clone(),
        })
        .collect();
    let inventory = Inventory::from_plan(&plan, |i| keys.get(i).and_then(|k| k.namespace.clone()));
    let chart_version = version.or_else(|| {
        plan.charts
            .first()
            .map(|c| c.version.clone())
            .filter(|v| !v.is_empty())
    });
    let deployable = Deployable {
        rules: crate::rollout::rules_of_plan(&plan),
        plan,
        chart_version,
        keys,
        crd_keys,
        hooks,
        inventory,
        content: Default::default(),
        slim: false,
    };
    Ok((deployable, unserved))
}

/// The refusal of a chart with objects of kinds nothing serves, as `helm install` refuses it
/// ("no matches for kind ... ensure CRDs are installed first"): each kind once, with the first
/// object of it, its chart and template. Not cached: the release is planned again when
/// discovery changes (a CRD installed later), and goes on.
fn unserved_kinds(unserved: &[Resource]) -> Option<Refusal> {
    let mut kinds: Vec<(&str, &str, &Resource, usize)> = Vec::new();
    for resource in unserved {
        match kinds
            .iter_mut()
            .find(|(v, k, _, _)| *v == resource.api_version && *k == resource.kind)
        {
            Some(entry) => entry.3 += 1,
            None => kinds.push((&resource.api_version, &resource.kind, resource, 1)),
        }
    }
    if kinds.is_empty() {
        return None;
    }
    let named: Vec<String> = kinds
        .iter()
        .map(|(version, kind, first, count)| {
            let more = match count {
                1 => String::new(),
                n => format!(", and {} more", n - 1),
            };
            format!(
                "no matches for kind \"{kind}\" in version \"{version}\" ({kind}/{} of chart {}, {}{more})",
                first.name, first.chart, first.template
            )
        })
        .collect();
    Some(Refusal {
        reason: Reason::UnknownKind,
        message: format!(
            "{}: no API server serves {}, nor does a CRD of the chart; ensure CRDs are installed first (helm install refuses the chart the same way). The release goes on by itself once {} served",
            named.join("; "),
            if kinds.len() == 1 {
                "this kind"
            } else {
                "these kinds"
            },
            if kinds.len() == 1 {
                "it is"
            } else {
                "they are"
            },
        ),
    })
}

/// A planned object's identity: its namespace as the cluster scopes its kind (a kind the
/// cluster does not serve yet is scoped as the chart's CRDs say, else namespaced). An object
/// of a kind neither serves goes into `unserved`.
async fn key_of(
    resource: &Resource,
    cluster: &Cluster,
    crd_scopes: &HashMap<(String, String), bool>,
    target_namespace: &str,
    unserved: &mut Vec<Resource>,
) -> Result<ObjectKey, Error> {
    let chart_scope = || {
        crd_scopes
            .get(&(resource.api_version.clone(), resource.kind.clone()))
            .copied()
    };
    let namespaced = match cluster.kind(&resource.api_version, &resource.kind).await {
        Ok(kind) => kind.namespaced,
        Err(ClusterError::UnknownKind { .. }) => match chart_scope() {
            Some(namespaced) => namespaced,
            None => {
                unserved.push(Resource {
                    object: Value::Null,
                    ..resource.clone()
                });
                true
            }
        },
        // Its group is down: the chart may well define it (an aggregated API it installs).
        Err(unavailable @ ClusterError::GroupUnavailable { .. }) => match chart_scope() {
            Some(namespaced) => namespaced,
            None => return Err(unavailable.into()),
        },
        Err(e) => return Err(e.into()),
    };
    Ok(ObjectKey {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
        namespace: namespaced.then(|| {
            resource
                .namespace
                .clone()
                .unwrap_or_else(|| target_namespace.to_string())
        }),
        name: resource.name.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::Renders;
    use std::time::Duration;

    #[tokio::test]
    async fn one_namespace_renders_on_every_core_but_never_holds_every_permit() {
        let renders = Renders::new(2);
        let a1 = renders.acquire("team-a").await;
        let _a2 = renders.acquire("team-a").await;
        // Team A's third render waits, whatever is left...
        let third = tokio::time::timeout(Duration::from_millis(100), renders.acquire("team-a"));
        assert!(third.await.is_err(), "team A held every permit");
        // ...and team B's goes at once.
        let b = tokio::time::timeout(Duration::from_millis(100), renders.acquire("team-b")).await;
        assert!(b.is_ok(), "team B waited for team A");
        // Every permit is held now: team C waits for the first render to end.
        let c = tokio::time::timeout(Duration::from_millis(100), renders.acquire("team-c"));
        assert!(c.await.is_err());
        drop(a1);
        let c = tokio::time::timeout(Duration::from_millis(100), renders.acquire("team-c"));
        assert!(c.await.is_ok(), "team A's permit was not given back");
    }

    #[tokio::test]
    async fn a_single_core_still_keeps_a_permit_for_another_namespace() {
        let renders = Renders::new(1);
        let _a = renders.acquire("team-a").await;
        let again = tokio::time::timeout(Duration::from_millis(100), renders.acquire("team-a"));
        assert!(again.await.is_err());
        let b = tokio::time::timeout(Duration::from_millis(100), renders.acquire("team-b"));
        assert!(b.await.is_ok());
    }
}
